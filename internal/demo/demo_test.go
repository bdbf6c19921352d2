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
	// The redelivery injector armed: a reset disarms it (issue 29).
	if _, err := db.Pool.Exec(ctx, `INSERT INTO event_injections (mode, remaining) VALUES ('deliver_twice', 5)`); err != nil {
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
	var armed int
	db.Pool.QueryRow(ctx, `SELECT count(*) FROM event_injections`).Scan(&armed)
	if armed != 0 {
		t.Errorf("the reset left %d redelivery injector entries armed", armed)
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

// A reset while a consumer is applying an event waits for the consumer's
// commit; neither is aborted as a deadlock. (With the consumers' tables
// named after users, the reset held users while it waited for the inbox,
// and the consumer's foreign-key check on users then waited for the reset.)
func TestResetWaitsForAConsumerMidEvent(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	// The consumer's transaction, as internal/events runs it: the inbox row
	// first, then the effect, which points at a user.
	consumer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Rollback(ctx)
	if _, err := consumer.Exec(ctx, `INSERT INTO inbox (consumer, event_id, event_type) VALUES ('notifications', gen_random_uuid(), 'policy.cancelled')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{PoliciesPerUser: 1, Slots: 1}, time.Now(), demo.TokenFor([]byte("s")))
		done <- err
	}()
	// Until the reset is waiting on the inbox's lock.
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%TRUNCATE%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// deadlock_timeout (1 s by default) passes while the consumer goes on.
	time.Sleep(1200 * time.Millisecond)
	if _, err := consumer.Exec(ctx, `INSERT INTO mailbox (user_id, event_id, subject, body)
		SELECT id, gen_random_uuid(), 's', 'b' FROM users WHERE name = 'alice'`); err != nil {
		t.Fatalf("the consumer's effect: %v", err)
	}
	if err := consumer.Commit(ctx); err != nil {
		t.Fatalf("the consumer's commit: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the reset: %v", err)
	}
}
