package main

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"net/http/cookiejar"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/invariants"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/reconciliation"
)

func cancelOpReq(opID int64, token, key string) request {
	return request{Method: "POST", Path: fmt.Sprintf("/api/v1/operations/%d/cancel", opID), Token: token,
		Header: map[string]string{"Idempotency-Key": key}}
}

type cancelledJSON struct {
	ID                int64   `json:"id"`
	Status            string  `json:"status"`
	CancelRequestedAt *string `json:"cancel_requested_at"`
	CancelRequestedBy *string `json:"cancel_requested_by"`
	Steps             []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"steps"`
}

// until polls the operation as the admin sees it until done says so.
func (s *testServer) until(t *testing.T, opID int64, within time.Duration, done func(cancelledJSON) bool) cancelledJSON {
	t.Helper()
	var op cancelledJSON
	for end := time.Now().Add(within); ; {
		op = cancelledJSON{}
		s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", opID), Token: "demo-admin"}).JSON(t, &op)
		if done(op) {
			return op
		}
		if time.Now().After(end) {
			t.Fatalf("operation %d after %v: %+v", opID, within, op)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *testServer) auditedCancels(t *testing.T, opID int64) int {
	t.Helper()
	var n int
	if err := s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM reconciliation_decisions WHERE operation_id = $1 AND decision = 'cancel'`, opID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// adminPage is a page as the signed-in admin sees it.
func (s *testServer) adminPage(t *testing.T, path string) response {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	client := noRedirectClient(jar)
	s.signIn(t, client, "admin")
	return doWith(t, client, s.URL, request{Method: "GET", Path: path})
}

func stepState(op cancelledJSON, name string) string {
	for _, s := range op.Steps {
		if s.Name == name {
			return s.State
		}
	}
	return ""
}

// An admin cancels a live policy cancellation whose provider call is
// already SENT: the mark is keyed, audited and refused a second time; the
// call is not undone — recovery learns that the provider did cancel, and
// since nothing un-cancels a policy, a person decides. A customer may not
// cancel; a finished operation is not live.
func TestAdminCancelsALiveOperationAfterItsStepTookEffect(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeSlow; f.SlowMS = 2500 })
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "c-1", ""))
	var live operationJSON
	r.JSON(t, &live)
	if r.Status != 202 {
		t.Fatalf("cancel with the provider slow: %d %s", r.Status, r.Body)
	}
	if r := s.do(cancelOpReq(live.ID, "demo-alice", "stop-alice")); r.Status != 403 {
		t.Errorf("a customer cancelling an operation: %d, want 403", r.Status)
	}
	// Two admins at once, different keys: one mark, one line in the audit trail.
	answers := make(chan response, 2)
	for _, key := range []string{"stop-1", "stop-2"} {
		go func() { answers <- s.do(cancelOpReq(live.ID, "demo-admin", key)) }()
	}
	a, b := <-answers, <-answers
	if a.Status == 409 {
		a, b = b, a
	}
	if a.Status != 202 || b.Status != 409 || b.problemType() != "cancel-already-requested" {
		t.Fatalf("two cancels at once: %d %s / %d %s; want one 202 and one 409 cancel-already-requested", a.Status, a.Body, b.Status, b.Body)
	}
	var marked cancelledJSON
	a.JSON(t, &marked)
	if marked.CancelRequestedAt == nil || a.Header.Get("Location") == "" {
		t.Errorf("the cancel's answer: %s (Location %q)", a.Body, a.Header.Get("Location"))
	}
	// The keyed replay: the same key answers the same bytes.
	key := "stop-1"
	if a.Header.Get("Idempotent-Replayed") == "" && !bytes.Contains(a.Body, []byte(`"cancel_requested_at"`)) {
		t.Fatal("no body")
	}
	for _, k := range []string{"stop-1", "stop-2"} {
		if again := s.do(cancelOpReq(live.ID, "demo-admin", k)); again.Header.Get("Idempotent-Replayed") != "true" ||
			(again.Status != a.Status && again.Status != b.Status) {
			t.Errorf("replay of %s: %d %q", k, again.Status, again.Header.Get("Idempotent-Replayed"))
		}
	}
	_ = key
	if n := s.auditedCancels(t, live.ID); n != 1 {
		t.Errorf("%d cancels in the audit trail, want 1", n)
	}

	op := s.until(t, live.ID, 20*time.Second, func(op cancelledJSON) bool { return op.Status == "NEEDS_RECONCILIATION" })
	if stepState(op, "provider_cancel") != "DONE" || stepState(op, "mark_cancelled") != "PENDING" || stepState(op, "refund") != "PENDING" {
		t.Errorf("steps after the cancel: %+v; want provider_cancel DONE (its truth learned), nothing after it run", op.Steps)
	}
	if s.effects(t, pid) != 1 {
		t.Errorf("provider effects %d, want 1 (the call already sent, never sent again)", s.effects(t, pid))
	}
	// The desk and the operation page say what happened (issue 29's second
	// read): cancelled after an effect — not "mark_cancelled at " with no
	// system, not "the outcome of refund is not known", not "Cancelled."
	// while it waits; nothing to ask, and the one decision the engine allows.
	var d struct {
		ByReason map[string]int `json:"by_reason"`
		Items    []struct {
			OperationID int64                 `json:"operation_id"`
			Reason      string                `json:"reason"`
			Advice      reconciliation.Advice `json:"advice"`
		} `json:"items"`
	}
	s.do(request{Method: "GET", Path: "/api/v1/reconciliation", Token: "demo-admin"}).JSON(t, &d)
	if len(d.Items) != 1 || d.Items[0].Reason != "cancelled" || d.ByReason["cancelled"] != 1 || d.ByReason["inconsistent"] != 0 {
		t.Errorf("the desk: %+v; want one item, reason cancelled", d)
	} else {
		a := d.Items[0].Advice
		for _, c := range a.Actions {
			if c.Enabled != (c.Action == "retry") {
				t.Errorf("%s enabled=%t: the engine allows only handing it back (%s)", c.Action, c.Enabled, c.Disabled)
			}
		}
	}
	desk := pageText(s.adminPage(t, "/reconciliation").Body)
	for _, want := range []string{"cancelled before mark_cancelled, after provider_cancel at provider had taken effect", "cancelled after an effect 1"} {
		if !strings.Contains(desk, want) {
			t.Errorf("the desk does not say %q", want)
		}
	}
	for _, wrong := range []string{"Waiting for a person: mark_cancelled", "Mark_cancelled was in a state", "whether received", "yourself", "Ask again for all"} {
		if strings.Contains(desk, wrong) {
			t.Errorf("the desk says %q of a cancel after an effect", wrong)
		}
	}
	page := pageText(s.adminPage(t, fmt.Sprintf("/operations/%d", live.ID)).Body)
	if !strings.Contains(page, "Cancel requested.") || strings.Contains(page, "Cancelled.") ||
		!strings.Contains(page, "cancelled before mark_cancelled") || strings.Contains(page, "the outcome of refund") {
		t.Errorf("the operation page of a cancel waiting for a person says:\n%s", page)
	}
	if r := s.do(cancelOpReq(live.ID, "demo-admin", "stop-3")); r.Status != 409 || r.problemType() != "cancel-already-requested" {
		t.Errorf("cancelling again: %d %s", r.Status, r.Body)
	}
	// A finished operation is not live.
	s.setFaults(t, func(f *fake.Fault) {})
	bobs := s.policyOf(t, "demo-bob", 0)
	var done operationJSON
	s.do(cancelReq(bobs, "demo-bob", "c-2", "")).JSON(t, &done)
	// On a loaded machine the call may outlive PROVIDER_TIMEOUT (a 202):
	// recovery finishes it; the test needs it finished, not fast.
	waitFor(t, 2*time.Minute, func() bool {
		s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", done.ID), Token: "demo-bob"}).JSON(t, &done)
		return done.Status == "SUCCEEDED"
	})
	if r := s.do(cancelOpReq(done.ID, "demo-admin", "stop-4")); r.Status != 409 || r.problemType() != "not-live" {
		t.Errorf("cancelling a SUCCEEDED operation: %d %s", r.Status, r.Body)
	}
	if r := s.do(cancelOpReq(999999, "demo-admin", "stop-5")); r.Status != 404 {
		t.Errorf("cancelling no operation: %d", r.Status)
	}
	rep, err := invariants.Check(context.Background(), s.DB.Pool, invariants.Options{})
	if err != nil || !rep.OK {
		t.Fatalf("invariants: %v %+v", err, rep.Violations)
	}
}

// Cancelled while its call is SENT and the provider never got it
// (NOT_STARTED once every deadline passed): the operation stops before
// sending it again — nothing was done elsewhere — and FAILS; the policy
// stays ACTIVE and the provider applied nothing.
func TestAdminCancelsBeforeAnyStepTookEffect(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeDrop })
	pid := s.policyOf(t, "demo-alice", 0)
	var live operationJSON
	if r := s.do(cancelReq(pid, "demo-alice", "c-1", "")); r.Status != 202 {
		t.Fatalf("cancel with the provider dropping: %d %s", r.Status, r.Body)
	} else {
		r.JSON(t, &live)
	}
	if r := s.do(cancelOpReq(live.ID, "demo-admin", "stop-1")); r.Status != 202 {
		t.Fatalf("cancel the operation: %d %s", r.Status, r.Body)
	}
	s.setFaults(t, func(f *fake.Fault) {}) // a resend would now apply: none may come
	op := s.until(t, live.ID, 20*time.Second, func(op cancelledJSON) bool { return op.Status == "FAILED" })
	if stepState(op, "provider_cancel") != "CANCELLED" || stepState(op, "mark_cancelled") != "CANCELLED" {
		t.Errorf("steps: %+v; want provider_cancel and what follows CANCELLED", op.Steps)
	}
	var pol policyJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/policies/%d", pid), Token: "demo-alice"}).JSON(t, &pol)
	if pol.Status != "ACTIVE" || s.effects(t, pid) != 0 {
		t.Errorf("policy %s with %d provider effects, want ACTIVE with 0", pol.Status, s.effects(t, pid))
	}
	page := s.adminPage(t, fmt.Sprintf("/operations/%d", live.ID))
	if !bytes.Contains(page.Body, []byte("stopped before anything was done")) {
		t.Errorf("the page does not say it was stopped before anything was done")
	}
}

// A deposit booking cancelled while its charge is SENT: the charge goes
// through (COMPLETED), so the booking's compensation refunds it under its
// own key and lets the hold go; the booking is CANCELLED, the slot free.
// Refused by the payments service instead, there is nothing to undo.
func TestAdminCancelsADepositBookingAndItIsCompensated(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms"})
	ctl := paymentsfake.NewControl(s.PaymentsURL, "")
	defer ctl.CloseIdleConnections()
	f := fault.Default()
	f.Mode, f.SlowMS = fault.ModeSlow, 1500
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	slot := depositSlot(t, s.DB, 0)
	b := s.book("demo-bob", slot, "book-1", "")
	var pending struct {
		OperationID int64 `json:"operation_id"`
		Operation   struct {
			ID int64 `json:"id"`
		} `json:"operation"`
	}
	b.JSON(t, &pending)
	opID := max(pending.OperationID, pending.Operation.ID)
	if b.Status != 202 || opID == 0 {
		t.Fatalf("a deposit booking with payments slow: %d %s", b.Status, b.Body)
	}
	if r := s.do(cancelOpReq(opID, "demo-admin", "stop-1")); r.Status != 202 {
		t.Fatalf("cancel the booking's operation: %d %s", r.Status, r.Body)
	}
	op := s.until(t, opID, 30*time.Second, func(op cancelledJSON) bool { return op.Status == "FAILED" || op.Status == "NEEDS_RECONCILIATION" })
	if op.Status != "FAILED" || stepState(op, "charge_deposit") != "DONE" || stepState(op, "confirm") != "CANCELLED" ||
		stepState(op, "refund_charge") != "DONE" || stepState(op, "release_cancelled") != "DONE" {
		t.Fatalf("after the cancel: %s %+v; want the charge DONE, confirm CANCELLED, refund_charge and release_cancelled DONE", op.Status, op.Steps)
	}
	var bk, sl string
	if err := s.DB.Pool.QueryRow(context.Background(), `
		SELECT b.status, s.status FROM bookings b JOIN slots s ON s.id = b.slot_id WHERE b.id = (SELECT booking_id FROM operations WHERE id = $1)`,
		opID).Scan(&bk, &sl); err != nil {
		t.Fatal(err)
	}
	if bk != "CANCELLED" || sl != "AVAILABLE" {
		t.Errorf("booking %s, slot %s; want CANCELLED and AVAILABLE", bk, sl)
	}
	page := s.adminPage(t, fmt.Sprintf("/operations/%d", opID))
	if !bytes.Contains(page.Body, []byte("money taken was refunded")) {
		t.Errorf("the page does not say the money was refunded")
	}

	// Refused instead: nothing to undo; the hold is released as for any refusal.
	f.Mode = fault.ModeReject
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	rep, err := invariants.Check(context.Background(), s.DB.Pool, invariants.Options{})
	if err != nil || !rep.OK {
		t.Fatalf("invariants: %v %+v", err, rep.Violations)
	}
}

var tags = regexp.MustCompile(`(?s)<script.*?</script>|<[^>]*>`)

// pageText is what a reader of an HTML page reads: its text, tags gone,
// entities decoded, runs of white space one space.
func pageText(body []byte) string {
	return strings.Join(strings.Fields(html.UnescapeString(tags.ReplaceAllString(string(body), " "))), " ")
}
