package pgcluster_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/pgcluster"
)

// Two clients sharing one server connection through PgBouncer in
// transaction mode: with pgx's default (named prepared statements, cached
// per client connection) the second client's statement collides with the
// first's on the server; with default_query_exec_mode=cache_describe (the
// bouncer's URL) nothing is prepared by name and both work.
func TestBouncerNeedsUnnamedStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	b := pgcluster.BouncerForTest(t, c, 1)
	query := func(url string) error {
		var errs []string
		for range 2 {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := conn.QueryRow(ctx, `SELECT $1::int + 1`, 1).Scan(new(int)); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(errs) > 0 {
			return errors.New(strings.Join(errs, "; "))
		}
		return nil
	}
	if err := query(b.URLFor("postgres")); err != nil {
		t.Fatalf("cache_describe through the bouncer: %v", err)
	}
	named := strings.Replace(b.URLFor("postgres"), "default_query_exec_mode=cache_describe", "default_query_exec_mode=cache_statement", 1)
	err := query(named)
	if err == nil || !strings.Contains(err.Error(), "prepared statement") {
		t.Fatalf("named statements through the bouncer: %v, want a prepared statement collision", err)
	}
	t.Logf("pgx's default through PgBouncer 1.18: %v", err)
}
