package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/events"
	tasksfake "github.com/idemlab/idemlab/internal/tasks/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// writeCancelledEvent commits a policy.cancelled event for alice's first
// policy, the way the cancellation's mark_cancelled transaction writes it.
func writeCancelledEvent(t *testing.T, s *testServer) string {
	t.Helper()
	ctx := context.Background()
	var userID, policyID int64
	var number, premium string
	err := s.DB.Pool.QueryRow(ctx, `
		SELECT u.id, p.id, p.number, p.premium::text
		  FROM users u JOIN policies p ON p.user_id = u.id
		 WHERE u.name = 'alice'
		 ORDER BY p.id LIMIT 1`).Scan(&userID, &policyID, &number, &premium)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	err = pgx.BeginFunc(ctx, s.DB.Pool, func(tx pgx.Tx) error {
		uid, err := events.NewWriter(nil).Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
			PolicyID: policyID, PolicyNumber: number, UserID: userID, OperationID: 1,
			RefundKey: "1:refund", RefundAmount: premium, CancelledAt: time.Now()}))
		id = uid.String()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// eventsAPI reads GET /api/v1/events.
func (s *testServer) eventsAPI(t *testing.T) eventsSnapshotJSON {
	t.Helper()
	var snap eventsSnapshotJSON
	r := s.do(request{Method: "GET", Path: "/api/v1/events", Token: "demo-admin"})
	if r.Status != http.StatusOK {
		t.Fatalf("GET /api/v1/events = %d %s", r.Status, r.Body)
	}
	r.JSON(t, &snap)
	return snap
}

type eventsSnapshotJSON struct {
	Overview events.Overview   `json:"overview"`
	Events   []events.EventRow `json:"events"`
}

func (snap eventsSnapshotJSON) event(id string) (events.EventRow, bool) {
	for _, e := range snap.Events {
		if e.ID.String() == id {
			return e, true
		}
	}
	return events.EventRow{}, false
}

// On every transport, end to end through the app: the injector makes the
// notifications consumer fail after its commit, the transport delivers the
// event again, the inbox catches it — the Events page says so, and alice's
// mailbox holds exactly one message.
func TestEventsRedeliveredAndDeduplicatedEndToEnd(t *testing.T) {
	t.Parallel()
	for _, transport := range events.Transports {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, map[string]string{"EVENTS_TRANSPORT": transport, "EVENTS_RELAY_INTERVAL": "200ms"})
			r := s.do(request{Method: "PUT", Path: "/api/v1/admin/events/injector", Token: "demo-admin",
				Body: `{"mode": "fail_after_commit", "consumer": "notifications", "count": 1}`})
			if r.Status != http.StatusOK {
				t.Fatalf("arm the injector: %d %s", r.Status, r.Body)
			}
			// The app records its transport at start; wait for it before writing.
			waitUntil(t, 10*time.Second, func() bool {
				return s.eventsAPI(t).Overview.Transport == transport
			})
			id := writeCancelledEvent(t, s)
			var ev events.EventRow
			waitUntil(t, 30*time.Second, func() bool {
				e, ok := s.eventsAPI(t).event(id)
				ev = e
				dup := false
				for _, d := range e.Deliveries {
					dup = dup || (d.Consumer == events.ConsumerNotifications && d.Outcome == events.OutcomeDuplicate)
				}
				return ok && dup
			})
			applied := map[string]int{}
			for _, d := range ev.Deliveries {
				if d.Outcome == events.OutcomeApplied {
					applied[d.Consumer]++
				}
			}
			if applied[events.ConsumerNotifications] != 1 {
				t.Errorf("notifications applied the event %d times, want once", applied[events.ConsumerNotifications])
			}
			var mail struct {
				Messages []events.MailMessage `json:"messages"`
			}
			s.do(request{Method: "GET", Path: "/api/v1/mailbox", Token: "demo-alice"}).JSON(t, &mail)
			if len(mail.Messages) != 1 || mail.Messages[0].EventID.String() != id {
				b, _ := json.Marshal(mail)
				t.Errorf("alice's mailbox = %s, want the one message of event %s", b, id)
			}
			if transport != events.TransportTasks {
				return
			}

			// The page, as the admin sees it, at both widths.
			ctx := browsertest.New(t)
			var dups, tasksDups, history string
			err := chromedp.Run(ctx,
				chromedp.Navigate(s.URL+"/signin"),
				chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
				chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
				chromedp.Navigate(s.URL+"/events"),
				chromedp.WaitVisible(`[data-testid="dedupe-table"]`, chromedp.ByQuery),
				chromedp.Text(`[data-testid="dups-notifications"]`, &dups, chromedp.ByQuery),
				chromedp.Text(`[data-testid="inbox-dups-tasks"]`, &tasksDups, chromedp.ByQuery),
				chromedp.Click(`[data-testid="event-`+id+`"] summary`, chromedp.ByQuery),
				chromedp.Text(`[data-testid="event-`+id+`"] .event-history`, &history, chromedp.ByQuery),
			)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(dups) != "1" || strings.TrimSpace(tasksDups) != "1" {
				t.Errorf("the page says the notifications inbox caught %q duplicates, %q on tasks; want 1 and 1", dups, tasksDups)
			}
			if !strings.Contains(history, "caught by the inbox") || !strings.Contains(history, "fail_after_commit") {
				t.Errorf("the event's history does not show the injected redelivery caught by the inbox:\n%s", history)
			}
			browsertest.Screenshot(ctx, t, "events-1280")
			if err := chromedp.Run(ctx, chromedp.EmulateViewport(390, 844)); err != nil {
				t.Fatal(err)
			}
			browsertest.Screenshot(ctx, t, "events-390")

			// Alice sees her message on the same page.
			var mailbox string
			alice := browsertest.New(t)
			err = chromedp.Run(alice, chromedp.EmulateViewport(390, 844),
				chromedp.Navigate(s.URL+"/signin"),
				chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
				chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
				chromedp.Navigate(s.URL+"/events"),
				chromedp.WaitVisible(`[data-testid="mailbox"]`, chromedp.ByQuery),
				chromedp.Text(`[data-testid="mailbox"]`, &mailbox, chromedp.ByQuery),
			)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Count(mailbox, "A refund of") != 1 {
				t.Errorf("alice's mailbox: %q, want one cancellation message", mailbox)
			}
			var tables int
			chromedp.Run(alice, chromedp.Evaluate(`document.querySelectorAll('[data-testid="events-table"], [data-testid="injector-form"]').length`, &tables))
			if tables != 0 {
				t.Errorf("a customer sees the events table or the injector")
			}
			browsertest.Screenshot(alice, t, "mailbox-390")
		})
	}
}

// The relay and a consumer killed with SIGKILL at their crash points, in a
// real process, then the server restarted: nothing is lost, and each event
// is applied once per consumer. On NATS the broker's dedupe window catches
// the relay's second publish; on Kafka nothing does (a new producer session,
// no window on the event id) and the inbox catches it; a consumer's
// redelivery — JetStream's after AckWait, Kafka's from the group's committed
// offset, which the dead member never moved — is the inbox's on both.
func TestEventsCrashPointsSIGKILLThenRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		transport, at string
		// the layer that must have caught a duplicate after the restart
		caught string
	}{
		{"nats", "relay_after_publish_before_mark", "broker"},
		{"nats", "consumer_after_commit_before_ack", "inbox"},
		{"kafka", "relay_after_publish_before_mark", "inbox"},
		{"kafka", "consumer_after_commit_before_ack", "inbox"},
		{"tasks", "relay_after_publish_before_mark", "broker"}, // the queue refuses the second create by name
		{"tasks", "consumer_after_commit_before_ack", "inbox"},
	} {
		t.Run(tc.transport+"/"+tc.at, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			env := map[string]string{
				"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "PROVIDER_ADDR": "127.0.0.1:0", "PAYMENTS_ADDR": "127.0.0.1:0",
				"SESSION_SECRET": "s", "LOG_LEVEL": "warn", "DB_MAX_CONNS": "5",
				"EVENTS_TRANSPORT": tc.transport,
				"EVENTS_ACK_WAIT":  "1s", "EVENTS_RELAY_INTERVAL": "100ms",
				"EVENTS_RELAY_LEASE": "2s", // the dead relay's claim runs out quickly
			}
			if tc.transport == "kafka" {
				// The broker outlives the killed server: it runs here, in
				// the test, as `web kafka` or a real cluster would.
				broker, err := events.StartKafkaBroker(events.KafkaBrokerConfig{Addr: "127.0.0.1:0"})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(broker.Close)
				env["KAFKA_BROKERS"] = broker.Addr()
				env["EVENTS_KAFKA_SESSION_TIMEOUT"] = "2s" // the dead member leaves its group after it
			}
			if tc.transport == "tasks" {
				// The queue outlives the killed server (it runs here, as
				// `web tasks` would) and pushes to the server's fixed
				// address: the dead one's, then the restarted one's.
				env["TASKS_URL"] = startTaskQueue(t, db)
				env["ADDR"] = freeAddr(t)
				env["TASKS_PUSH_TOKEN"] = "crash-test-token"
			}
			crashing := map[string]string{"CRASH_AT": tc.at}
			for k, v := range env {
				crashing[k] = v
			}
			victim := startChild(t, crashing)
			s := &testServer{URL: victim.URL, DB: db, t: t}
			waitUntil(t, 10*time.Second, func() bool { // the transport is recorded at start
				var tr string
				db.Pool.QueryRow(ctx, `SELECT transport FROM events_config`).Scan(&tr)
				return tr == tc.transport
			})
			id := writeCancelledEvent(t, s)
			state := victim.waitExit(t, 30*time.Second)
			if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the server ended with %v, not SIGKILL", state)
			}
			var status string
			db.Pool.QueryRow(ctx, `SELECT status FROM outbox WHERE id = $1`, id).Scan(&status)
			if tc.at == "relay_after_publish_before_mark" && status != "PENDING" {
				t.Fatalf("after the relay's crash the event is %s, want PENDING (published, not marked)", status)
			}
			if tc.at == "consumer_after_commit_before_ack" {
				var applied int
				db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id = $1`, id).Scan(&applied)
				if applied == 0 {
					t.Fatalf("the server died at %s with nothing applied", tc.at)
				}
			}

			restarted := startChild(t, env)
			s = &testServer{URL: restarted.URL, DB: db, t: t}
			waitUntil(t, 60*time.Second, func() bool {
				var inbox, caught int
				db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id = $1`, id).Scan(&inbox)
				if tc.caught == "broker" {
					db.Pool.QueryRow(ctx, `SELECT count(*) FROM event_publishes WHERE event_id = $1 AND duplicate`, id).Scan(&caught)
				} else {
					db.Pool.QueryRow(ctx, `SELECT count(*) FROM event_deliveries WHERE event_id = $1 AND outcome = 'duplicate'`, id).Scan(&caught)
				}
				return inbox == len(events.Consumers) && caught >= 1
			})
			var mail, lines int
			db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM mailbox WHERE event_id = $1), (SELECT count(*) FROM ledger_entries WHERE event_id = $1)`, id).Scan(&mail, &lines)
			if mail != 1 || lines != 1 {
				t.Errorf("after the crash and restart: %d messages and %d ledger lines, want one of each", mail, lines)
			}
			s.assertInvariants(t)
		})
	}
}

// startTaskQueue runs the fake task queue on db in the test process until
// the test ends, and returns its URL.
func startTaskQueue(t *testing.T, db *testdb.DB) string {
	t.Helper()
	q, err := tasksfake.New(db.Pool, tasksfake.Config{Instance: "test-queue", DispatchDeadline: time.Second,
		MaxBackoff: 500 * time.Millisecond, Interval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(q.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); q.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return srv.URL
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
