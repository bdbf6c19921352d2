package testdb_test

import (
	"context"
	"testing"

	"github.com/idemlab/idemlab/internal/testdb"
)

func TestNewGivesAMigratedIsolatedDatabase(t *testing.T) {
	t.Parallel()
	a, b := testdb.New(t), testdb.New(t)
	if a.Name == b.Name {
		t.Fatalf("two tests share database %s", a.Name)
	}
	ctx := context.Background()
	if _, err := a.Pool.Exec(ctx, `INSERT INTO users (name, api_token_sha256) VALUES ('x', '\x01')`); err != nil {
		t.Fatalf("insert into a: %v", err)
	}
	var n int
	if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM users`).Scan(&n); err != nil {
		t.Fatalf("count in b: %v", err)
	}
	if n != 0 {
		t.Fatalf("b sees %d users written to a", n)
	}
}
