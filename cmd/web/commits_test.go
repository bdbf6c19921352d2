package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/pgcluster"
	"github.com/idemlab/idemlab/internal/testdb"
)

// Every workflow commits as often as the shape of every workflow (docs/idempotency.md)
// says, and no more: work that stays in PostgreSQL commits once (the key's
// claim, the business writes and the stored answer together); a call to
// another system adds exactly two commits (that system's own, and the one
// recording its outcome with the answer); a replay commits nothing.
//
// Commits are counted as transaction ids handed out, on a private cluster
// nobody else uses, with autovacuum off: a transaction that only reads never
// gets an id, so nothing read-only can inflate the count, and a write that
// hides in a separate transaction cannot escape it. The background loops run
// but find nothing to do, and a loop pass that writes nothing takes no id.
func TestWriteTransactionsPerRequest(t *testing.T) {
	t.Parallel()
	cluster := pgcluster.ForTest(t, pgcluster.Options{DisableAutovacuum: true})
	pool, err := pgxpool.New(context.Background(), cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := startServerOn(t, &testdb.DB{Name: "postgres", URL: cluster.URL(), Pool: pool}, map[string]string{
		"RECOVERY_INTERVAL": "50ms", // running, and finding nothing to claim
		// The events a request writes are counted in its own commit; their
		// delivery (the relay's mark, each consumer's inbox) is other
		// processes' work, done by `web events` in a deployment that splits.
		"EVENTS_WORKERS": "off",
	})
	browser := s.browserClient()
	s.signIn(t, browser, "alice")
	m := csrfInput.FindSubmatch(doWith(t, browser, s.URL, request{Method: "GET", Path: "/slots"}).Body)
	if m == nil {
		t.Fatal("no CSRF token on /slots")
	}
	csrf := string(m[1])

	// commits counts the transaction ids handed out while do runs.
	commits := func(t *testing.T, do func()) int64 {
		t.Helper()
		next := func() int64 {
			var xmax int64
			// Reading the snapshot assigns no transaction id.
			if err := pool.QueryRow(context.Background(),
				`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xmax); err != nil {
				t.Fatal(err)
			}
			return xmax
		}
		before := next()
		do()
		return next() - before
	}

	policy := s.policyOf(t, "demo-alice", 0)
	formPolicy := s.policyOf(t, "demo-alice", 1)
	slot, formSlot := freeSlot(t, s.DB, 0), freeSlot(t, s.DB, 1)
	var bookingID int64

	// delivered waits until policyID's policy.cancelled has been published
	// and applied by both consumers — commits of the events' own workflow
	// (docs/events.md), which follow the request's asynchronously — and
	// counts them: the distinct transactions that wrote the event's rows
	// after the request's own (the outbox row's mark with the publish log,
	// each consumer's inbox row with its effect, the delivery log), plus the
	// relay's claim, whose row version the mark replaced (internal/events
	// relay.go: claim · publish · mark).
	delivered := func(t *testing.T, policyID int64) int64 {
		t.Helper()
		var n, applied int64
		for range 600 { // up to 30 s: the relay and both consumers, on a loaded machine
			err := pool.QueryRow(context.Background(), `
				WITH e AS (SELECT id FROM outbox WHERE key = 'policy:' || $1::bigint AND status = 'SENT')
				SELECT (SELECT count(*) FROM inbox WHERE event_id = (SELECT id FROM e)),
				       (SELECT count(DISTINCT x) FROM (
				            SELECT xmin::text AS x FROM outbox WHERE id = (SELECT id FROM e)
				            UNION ALL SELECT xmin::text FROM event_publishes WHERE event_id = (SELECT id FROM e)
				            UNION ALL SELECT xmin::text FROM event_deliveries WHERE event_id = (SELECT id FROM e)
				            UNION ALL SELECT xmin::text FROM inbox WHERE event_id = (SELECT id FROM e)
				            UNION ALL SELECT xmin::text FROM mailbox WHERE event_id = (SELECT id FROM e)
				            UNION ALL SELECT xmin::text FROM ledger_entries WHERE event_id = (SELECT id FROM e)) w)`,
				policyID).Scan(&applied, &n)
			if err != nil {
				t.Fatal(err)
			}
			if applied == 2 {
				time.Sleep(100 * time.Millisecond) // the delivery log's last line
				pool.QueryRow(context.Background(), `
					WITH e AS (SELECT id FROM outbox WHERE key = 'policy:' || $1::bigint)
					SELECT count(DISTINCT x) FROM (
					    SELECT xmin::text AS x FROM outbox WHERE id = (SELECT id FROM e)
					    UNION ALL SELECT xmin::text FROM event_publishes WHERE event_id = (SELECT id FROM e)
					    UNION ALL SELECT xmin::text FROM event_deliveries WHERE event_id = (SELECT id FROM e)
					    UNION ALL SELECT xmin::text FROM inbox WHERE event_id = (SELECT id FROM e)
					    UNION ALL SELECT xmin::text FROM mailbox WHERE event_id = (SELECT id FROM e)
					    UNION ALL SELECT xmin::text FROM ledger_entries WHERE event_id = (SELECT id FROM e)) w`, policyID).Scan(&n)
				return n + 1 // the relay's claim
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("policy %d's event was not delivered", policyID)
		return 0
	}

	for _, tc := range []struct {
		name string
		want int64
		do   func(t *testing.T)
		// followers counts the commits of work the request set off that
		// runs after it (an event's delivery), already done when it returns.
		followers func(t *testing.T) int64
	}{
		{"book a slot", 1, func(t *testing.T) {
			r := s.book("demo-alice", slot, "commits-book", "")
			if r.Status != 201 {
				t.Fatalf("book: %d %s", r.Status, r.Body)
			}
			var b struct{ ID int64 }
			r.JSON(t, &b)
			bookingID = b.ID
		}, nil},
		{"replay the booking", 0, func(t *testing.T) {
			if r := s.book("demo-alice", slot, "commits-book", ""); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v", r.Status, r.Header)
			}
		}, nil},
		{"book a taken slot (the 409 is stored)", 1, func(t *testing.T) {
			if r := s.book("demo-bob", slot, "commits-taken", ""); r.Status != 409 {
				t.Fatalf("taken: %d %s", r.Status, r.Body)
			}
		}, nil},
		{"release the booking", 1, func(t *testing.T) {
			if r := s.release("demo-alice", bookingID, "commits-release"); r.Status != 200 {
				t.Fatalf("release: %d %s", r.Status, r.Body)
			}
		}, nil},
		{"book from the grid's form", 1, func(t *testing.T) {
			r := postForm(t, s, browser, fmt.Sprintf("/slots/%d/book", formSlot),
				url.Values{"_csrf": {csrf}, "idempotency_key": {"commits-form-book"}})
			if r.Status != 303 {
				t.Fatalf("form book: %d %s", r.Status, r.Body)
			}
		}, nil},
		{"cancel a policy, provider and payments ok: claim + intent · the provider's · its outcome + refund SENT · the payments service's · the refund's outcome + answer", 5, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-cancel", "")); r.Status != 200 {
				t.Fatalf("cancel: %d %s", r.Status, r.Body)
			}
		}, func(t *testing.T) int64 { return delivered(t, policy) }},
		{"replay the cancellation", 0, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-cancel", "")); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v", r.Status, r.Header)
			}
		}, nil},
		{"cancel again with another key (the duplicate-intent 409 is stored)", 1, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-dup", "")); r.Status != 409 {
				t.Fatalf("duplicate intent: %d %s", r.Status, r.Body)
			}
		}, nil},
		{"cancel from the policy page's form", 5, func(t *testing.T) {
			r := postForm(t, s, browser, fmt.Sprintf("/policies/%d/cancel", formPolicy),
				url.Values{"_csrf": {csrf}, "idempotency_key": {"commits-form-cancel"}})
			if r.Status != 303 || !strings.HasPrefix(r.Header.Get("Location"), "/operations/") {
				t.Fatalf("form cancel: %d %v %s", r.Status, r.Header, r.Body)
			}
		}, func(t *testing.T) int64 { return delivered(t, formPolicy) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var followers int64
			got := commits(t, func() {
				tc.do(t)
				if tc.followers != nil {
					followers = tc.followers(t)
				}
			})
			if got-followers != tc.want {
				t.Errorf("%d write transactions (%d of them the event's delivery), want %d of the request's", got, followers, tc.want)
			}
		})
	}
}

// With EVENTS_WORKERS=off an instance only writes events; `web events`
// delivers them, from another process.
func TestEventsWorkersRunInTheirOwnProcess(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	if r := s.book("demo-alice", freeSlot(t, s.DB, 0), "split-book", ""); r.Status != 201 {
		t.Fatalf("book: %d %s", r.Status, r.Body)
	}
	pending := func() (n int) {
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE status = 'PENDING'`).Scan(&n)
		return n
	}
	time.Sleep(time.Second)
	if n := pending(); n != 1 {
		t.Fatalf("%d pending events with no worker running, want the booking's 1", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	vars := map[string]string{"DATABASE_URL": s.DB.URL, "LOG_LEVEL": "warn", "DEMO_MODE": "true"}
	go func() {
		done <- run(ctx, []string{"events"}, func(k string) string { return vars[k] }, io.Discard, testLogWriter{t})
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, 20*time.Second, func() bool {
		var mail int
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM mailbox`).Scan(&mail)
		return pending() == 0 && mail == 1
	})
}
