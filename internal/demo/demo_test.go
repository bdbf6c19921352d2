package demo_test

import (
	"context"
	"errors"
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
	if nUsers != 4 || nPolicies != 3*demo.PoliciesPerCustomer || nSlots != 7*8*(len(demo.Resources)+1) {
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

func TestResetSeedsTheDatasetAndKeepsDemoTokens(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE policies SET status = 'CANCELLED' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	accounts, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{Users: 20, PoliciesPerUser: 3, Slots: 50}, time.Now(), demo.TokenFor([]byte("s")))
	if err != nil {
		t.Fatal(err)
	}
	if len(accounts) != 24 {
		t.Fatalf("%d accounts", len(accounts))
	}
	var nUsers, nPolicies, nCancelled, nSlots, minID int
	db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM policies),
		(SELECT count(*) FROM policies WHERE status <> 'ACTIVE'), (SELECT count(*) FROM slots), (SELECT min(id) FROM policies)`).
		Scan(&nUsers, &nPolicies, &nCancelled, &nSlots, &minID)
	if nUsers != 24 || nPolicies != 23*3 || nCancelled != 0 || nSlots != 50 || minID != 1 {
		t.Fatalf("users %d, policies %d (cancelled %d, first id %d), slots %d", nUsers, nPolicies, nCancelled, minID, nSlots)
	}
	st := users.NewStore(db.Pool)
	for _, a := range accounts {
		u, err := st.ByToken(ctx, a.Token)
		if err != nil || u.Name != a.Name {
			t.Fatalf("token of %s: %+v %v", a.Name, u, err)
		}
	}
	for _, bad := range []demo.Dataset{{Users: -1, PoliciesPerUser: 1, Slots: 1}, {PoliciesPerUser: 0, Slots: 1}, {PoliciesPerUser: 1, Slots: 0}, {Users: demo.MaxUsers + 1, PoliciesPerUser: 1, Slots: 1}} {
		if _, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), bad, time.Now(), demo.TokenFor([]byte("s"))); !errors.Is(err, demo.ErrInvalidDataset) {
			t.Errorf("Reset(%+v): %v", bad, err)
		}
	}
}
