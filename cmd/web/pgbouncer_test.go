package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/pgcluster"
	"github.com/idemlab/idemlab/internal/testdb"
)

// The app through PgBouncer in transaction mode (docs/scaling.md): the pool
// on the bouncer with default_query_exec_mode=cache_describe, the migrations' session
// lock and the relay's LISTEN on DATABASE_DIRECT_URL. Ten client
// connections share three server connections. Keyed cancellations sent
// three times at once each run once and replay; two users racing for a
// slot get one booking; the outbox's events are relayed.
func TestThroughPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and a PgBouncer")
	}
	t.Parallel()
	ctx := context.Background()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	b := pgcluster.BouncerForTest(t, c, 3)
	name := privateDatabase(t, c)
	s := startServerOn(t, &testdb.DB{URL: b.URLFor(name)}, map[string]string{
		"DATABASE_DIRECT_URL": c.URLFor(name), "DB_MAX_CONNS": "10", "FAKE_DB_MAX_CONNS": "4",
		"RATE_LIMIT_WRITES_PER_USER": "off",
	})
	pool, err := pgxpool.New(ctx, c.URLFor(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s.DB = &testdb.DB{URL: c.URLFor(name), Pool: pool}

	// Keyed cancellations: each key three times at once.
	rows, _ := pool.Query(ctx, `
		SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id
		 WHERE u.name = 'alice' AND p.status = 'ACTIVE' ORDER BY p.id LIMIT 3`)
	policies, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(policies) != 3 {
		t.Fatalf("alice's policies: %v %v", policies, err)
	}
	var wg sync.WaitGroup
	answers := make([]response, 9)
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = s.do(request{Method: "POST", Token: "demo-alice",
				Path:   fmt.Sprintf("/api/v1/policies/%d/cancel", policies[i%3]),
				Header: map[string]string{"Idempotency-Key": fmt.Sprintf("bouncer-%d", i%3)}})
		}()
	}
	close(start)
	wg.Wait()
	for i, r := range answers {
		if r.Status != 200 && !(r.Status == 409 && r.problemType() == "request-in-progress") {
			t.Fatalf("cancellation %d through the bouncer: %d %s", i, r.Status, r.Body)
		}
	}
	for i, id := range policies {
		r := s.do(request{Method: "POST", Token: "demo-alice", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", id),
			Header: map[string]string{"Idempotency-Key": fmt.Sprintf("bouncer-%d", i)}})
		if r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry of cancellation %d: %d %s", i, r.Status, r.Body)
		}
		if n := s.effects(t, id); n != 1 {
			t.Fatalf("policy %d: %d provider effects, want 1", id, n)
		}
	}

	// Bookings: alice and bob race for one slot.
	var slotID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM slots WHERE status = 'AVAILABLE' AND starts_at > now() ORDER BY id LIMIT 1`).Scan(&slotID); err != nil {
		t.Fatal(err)
	}
	booked := make([]response, 2)
	start = make(chan struct{})
	for i, token := range []string{"demo-alice", "demo-bob"} {
		wg.Add(1)
		go func() { defer wg.Done(); <-start; booked[i] = s.book(token, slotID, newKey(), "") }()
	}
	close(start)
	wg.Wait()
	created := 0
	for _, r := range booked {
		switch {
		case r.Status == http.StatusCreated:
			created++
		case r.Status == http.StatusConflict && r.problemType() == "slot-taken":
		default:
			t.Fatalf("booking through the bouncer: %d %s", r.Status, r.Body)
		}
	}
	if created != 1 {
		t.Fatalf("%d bookings of one slot", created)
	}
	assertInvariant3(t, s.DB)

	// The outbox drains: the relay's LISTEN and passes work beside the bouncer.
	waitUntil(t, 30*time.Second, func() bool {
		var pending int
		pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE status <> 'SENT'`).Scan(&pending)
		return pending == 0
	})
}
