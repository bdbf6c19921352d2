package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/users"
)

func TestSeedIsIdempotent(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	today := time.Date(2026, 12, 2, 15, 4, 0, 0, time.UTC)
	for range 2 {
		if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), today); err != nil {
			t.Fatalf("Seed: %v", err)
		}
	}
	var nUsers, nPolicies, nSlots int
	err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM policies), (SELECT count(*) FROM slots)`).Scan(&nUsers, &nPolicies, &nSlots)
	if err != nil {
		t.Fatal(err)
	}
	if nUsers != 4 || nPolicies != 3*demo.PoliciesPerCustomer || nSlots != 7*8*len(demo.Resources) {
		t.Fatalf("after two seeds: %d users, %d policies, %d slots", nUsers, nPolicies, nSlots)
	}
	u, err := users.NewStore(db.Pool).ByToken(ctx, "demo-alice")
	if err != nil || u.Name != "alice" {
		t.Fatalf("ByToken(demo-alice) = %+v, %v", u, err)
	}
}

func TestParseTokens(t *testing.T) {
	accts, err := demo.ParseTokens("alice=alice-secret-1, admin=admin-secret-1")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range accts {
		got[a.Name] = a.Token
	}
	if got["alice"] != "alice-secret-1" || got["admin"] != "admin-secret-1" || got["bob"] != "demo-bob" {
		t.Fatalf("tokens = %v", got)
	}
	for _, bad := range []string{"mallory=secret-secret", "alice", "alice=short"} {
		if _, err := demo.ParseTokens(bad); err == nil {
			t.Errorf("ParseTokens(%q) accepted", bad)
		}
	}
}
