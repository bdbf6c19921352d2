package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/events"
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
		uid, err := events.Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
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

// On both transports, end to end through the app: the injector makes the
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
			if transport != events.TransportNATS {
				return
			}

			// The page, as the admin sees it, at both widths.
			ctx := browsertest.New(t)
			var dups, history string
			err := chromedp.Run(ctx,
				chromedp.Navigate(s.URL+"/signin"),
				chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
				chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
				chromedp.Navigate(s.URL+"/events"),
				chromedp.WaitVisible(`[data-testid="dedupe-table"]`, chromedp.ByQuery),
				chromedp.Text(`[data-testid="dups-notifications"]`, &dups, chromedp.ByQuery),
				chromedp.Click(`[data-testid="event-`+id+`"] summary`, chromedp.ByQuery),
				chromedp.Text(`[data-testid="event-`+id+`"] .event-history`, &history, chromedp.ByQuery),
			)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(dups) != "1" {
				t.Errorf("the page says the notifications inbox caught %q duplicates, want 1", dups)
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
			err = chromedp.Run(alice,
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
			browsertest.Screenshot(alice, t, "mailbox-390")
		})
	}
}
