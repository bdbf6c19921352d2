package main

import (
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"strings"
	"testing"
)

// A deposit booking's pages speak of a booking (issue 29, finding 19: a
// deposit *booking* page said "Finished without cancelling" and "a
// cancellation asked for again…"). A booking whose deposit payments
// declined, and a booking's cancellation whose refund payments refused,
// read on their operation pages (admin and customer), their bookings'
// pages and the APIs: no policy's cancellation words on the booking, and
// the booking's cancellation says it is the booking's.
func TestABookingsPagesSpeakOfTheBooking(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PAYMENTS_TIMEOUT": "5s", "RECOVERY_INTERVAL": "1h"})
	setPayments := func(body string) {
		t.Helper()
		if r := s.do(request{Method: "PUT", Path: "/api/v1/payments/faults", Token: "demo-admin", Body: body}); r.Status != http.StatusOK {
			t.Fatalf("payments faults %s: %d %s", body, r.Status, r.Body)
		}
	}
	idOf := func(r response) (op, booking int64) {
		var v struct {
			ID          int64 `json:"id"`
			OperationID int64 `json:"operation_id"`
			Operation   *struct {
				ID int64 `json:"id"`
			} `json:"operation"`
		}
		json.Unmarshal(r.Body, &v)
		if v.Operation != nil {
			return v.Operation.ID, v.ID
		}
		return v.OperationID, v.ID
	}
	setPayments(`{"mode":"reject"}`)
	declined := s.book("demo-alice", depositSlot(t, s.DB, 0), newKey(), "")
	if declined.Status != http.StatusPaymentRequired {
		t.Fatalf("a declined deposit: %d %s", declined.Status, declined.Body)
	}
	bookOp, _ := idOf(declined)
	setPayments(`{"mode":"ok"}`)
	paid := s.book("demo-alice", depositSlot(t, s.DB, 1), newKey(), "")
	if paid.Status != http.StatusCreated {
		t.Fatalf("a paid deposit: %d %s", paid.Status, paid.Body)
	}
	_, booking := idOf(paid)
	setPayments(`{"mode":"reject"}`)
	refused := s.release("demo-alice", booking, newKey())
	if refused.Status != http.StatusConflict {
		t.Fatalf("a refused refund: %d %s", refused.Status, refused.Body)
	}
	cancelOp, _ := idOf(refused)
	if bookOp == 0 || cancelOp == 0 {
		t.Fatalf("operations %d, %d", bookOp, cancelOp)
	}

	admin, alice := s.browserClient(), s.browserClient()
	s.signIn(t, admin, "admin")
	s.signIn(t, alice, "alice")
	read := func(path string) string {
		t.Helper()
		var out []string
		for _, c := range []struct {
			name  string
			token string
		}{{"admin", "demo-admin"}, {"alice", "demo-alice"}} {
			var r response
			if strings.HasPrefix(path, "/api/") {
				r = s.do(request{Method: "GET", Path: path, Token: c.token})
			} else if c.name == "admin" {
				r = doWith(t, admin, s.URL, request{Method: "GET", Path: path})
			} else {
				r = doWith(t, alice, s.URL, request{Method: "GET", Path: path})
			}
			if r.Status != http.StatusOK {
				t.Fatalf("GET %s as %s: %d", path, c.name, r.Status)
			}
			out = append(out, html.UnescapeString(string(r.Body)))
		}
		return strings.Join(out, "\n")
	}
	// A policy's words; "without cancelling the booking" and "a booking's
	// cancellation asked for again" are the booking's own.
	policyWords := []string{"Finished without cancelling:", "Finished without cancelling.", "a cancellation asked for again",
		"Cancellation #", "the policy is cancelled", "cancel the policy", "The provider"}
	for _, path := range []string{fmt.Sprintf("/operations/%d", bookOp), fmt.Sprintf("/api/v1/operations/%d", bookOp)} {
		page := read(path)
		for _, w := range append(policyWords, "without cancelling", "cancellation") {
			if strings.Contains(page, w) {
				t.Errorf("the deposit booking's %s says %q", path, w)
			}
		}
	}
	for _, path := range []string{fmt.Sprintf("/operations/%d", cancelOp), fmt.Sprintf("/api/v1/operations/%d", cancelOp),
		fmt.Sprintf("/bookings/%d", booking)} {
		page := read(path)
		for _, w := range policyWords {
			if strings.Contains(page, w) {
				t.Errorf("the booking's cancellation's %s says %q", path, w)
			}
		}
	}
}
