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
		// The rate limits spend from buckets in PostgreSQL (rate_buckets, an
		// unlogged table): a transaction of the limiter's per limited
		// request, not the workflow's. Off here, so what is counted is the
		// workflow's own commits; docs/scaling.md gives the limiter's cost.
		"RATE_LIMIT_SIGNIN": "off", "RATE_LIMIT_BAD_TOKEN": "off", "RATE_LIMIT_WRITES_PER_USER": "off",
		"RATE_LIMIT_WRITES_PER_ADDRESS": "off", "RATE_LIMIT_LABS": "off",
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

	for _, tc := range []struct {
		name string
		want int64
		do   func(t *testing.T)
	}{
		{"book a slot", 1, func(t *testing.T) {
			r := s.book("demo-alice", slot, "commits-book", "")
			if r.Status != 201 {
				t.Fatalf("book: %d %s", r.Status, r.Body)
			}
			var b struct{ ID int64 }
			r.JSON(t, &b)
			bookingID = b.ID
		}},
		{"replay the booking", 0, func(t *testing.T) {
			if r := s.book("demo-alice", slot, "commits-book", ""); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v", r.Status, r.Header)
			}
		}},
		{"book a taken slot (the 409 is stored)", 1, func(t *testing.T) {
			if r := s.book("demo-bob", slot, "commits-taken", ""); r.Status != 409 {
				t.Fatalf("taken: %d %s", r.Status, r.Body)
			}
		}},
		{"release the booking", 1, func(t *testing.T) {
			if r := s.release("demo-alice", bookingID, "commits-release"); r.Status != 200 {
				t.Fatalf("release: %d %s", r.Status, r.Body)
			}
		}},
		{"book from the grid's form", 1, func(t *testing.T) {
			r := postForm(t, s, browser, fmt.Sprintf("/slots/%d/book", formSlot),
				url.Values{"_csrf": {csrf}, "idempotency_key": {"commits-form-book"}})
			if r.Status != 303 {
				t.Fatalf("form book: %d %s", r.Status, r.Body)
			}
		}},
		{"cancel a policy, provider and payments ok: claim + intent · the provider's · its outcome + refund SENT · the payments service's · the refund's outcome + answer", 5, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-cancel", "")); r.Status != 200 {
				t.Fatalf("cancel: %d %s", r.Status, r.Body)
			}
		}},
		{"replay the cancellation", 0, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-cancel", "")); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %v", r.Status, r.Header)
			}
		}},
		{"cancel again with another key (the duplicate-intent 409 is stored)", 1, func(t *testing.T) {
			if r := s.do(cancelReq(policy, "demo-alice", "commits-dup", "")); r.Status != 409 {
				t.Fatalf("duplicate intent: %d %s", r.Status, r.Body)
			}
		}},
		{"cancel from the policy page's form", 5, func(t *testing.T) {
			r := postForm(t, s, browser, fmt.Sprintf("/policies/%d/cancel", formPolicy),
				url.Values{"_csrf": {csrf}, "idempotency_key": {"commits-form-cancel"}})
			if r.Status != 303 || !strings.HasPrefix(r.Header.Get("Location"), "/operations/") {
				t.Fatalf("form cancel: %d %v %s", r.Status, r.Header, r.Body)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commits(t, func() { tc.do(t) }); got != tc.want {
				t.Errorf("%d write transactions, want %d", got, tc.want)
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
