package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/events"
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

// River (EVENTS_TRANSPORT=river) through PgBouncer in transaction mode.
// A DATABASE_DIRECT_URL beside a pooled DATABASE_URL puts River in
// poll-only mode: it never sends LISTEN through the bouncer, where the
// LISTEN would hold on a server connection the bouncer lends to the next
// client and River would wait for notifications that reach someone else.
// Keyed cancellations insert their events' jobs in the business
// transaction; every consumer applies every event, once.
func TestRiverThroughPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster and a PgBouncer")
	}
	t.Parallel()
	ctx := context.Background()
	// Every statement in the server's log, with the client's application
	// name: the direct pool's is "direct", the bouncer's connections have none.
	c := pgcluster.ForTest(t, pgcluster.Options{Settings: map[string]string{
		"log_statement": "'all'", "log_line_prefix": "'%m [%p] app=%a '"}})
	b := pgcluster.BouncerForTest(t, c, 3)
	name := privateDatabase(t, c)
	direct := c.URLFor(name) + "&application_name=direct"
	s := startServerOn(t, &testdb.DB{URL: b.URLFor(name)}, map[string]string{
		"DATABASE_DIRECT_URL": direct, "DB_MAX_CONNS": "10", "FAKE_DB_MAX_CONNS": "4",
		"RATE_LIMIT_WRITES_PER_USER": "off", "EVENTS_TRANSPORT": "river",
	})
	pool, err := pgxpool.New(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s.DB = &testdb.DB{URL: direct, Pool: pool}

	rows, _ := pool.Query(ctx, `
		SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id
		 WHERE u.name = 'alice' AND p.status = 'ACTIVE' ORDER BY p.id LIMIT 3`)
	policies, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(policies) != 3 {
		t.Fatalf("alice's policies: %v %v", policies, err)
	}
	for i, id := range policies {
		r := s.do(request{Method: "POST", Token: "demo-alice", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", id),
			Header: map[string]string{"Idempotency-Key": fmt.Sprintf("river-bouncer-%d", i)}})
		if r.Status != 200 {
			t.Fatalf("cancellation %d through the bouncer: %d %s", i, r.Status, r.Body)
		}
	}
	var written int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&written); err != nil || written < len(policies) {
		t.Fatalf("%d events written (%v), want at least %d", written, err, len(policies))
	}
	// Every consumer applies every event: River's jobs, worked through the bouncer.
	waitUntil(t, time.Minute, func() bool {
		var short int
		pool.QueryRow(ctx, `
			SELECT count(*)
			  FROM outbox o
			 WHERE (SELECT count(*) FROM inbox i WHERE i.event_id = o.id) < $1`, len(events.Consumers)).Scan(&short)
		return short == 0
	})
	s.assertInvariants(t) // invariant 9: each consumer applied each event once

	log, err := os.ReadFile(c.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if listenStatement.MatchString(line) && !strings.Contains(line, "app=direct ") {
			t.Errorf("a LISTEN went through the bouncer:\n%s", line)
		}
	}
}

// listenStatement is a LISTEN in the server's log (log_statement = all),
// sent by simple query or as an extended-protocol execute.
var listenStatement = regexp.MustCompile(`(statement|execute [^:]*): LISTEN\b`)
