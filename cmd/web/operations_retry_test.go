package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
)

func retryFromReq(opID int64, token, key, step string, seen time.Time) request {
	body, _ := json.Marshal(map[string]any{"step": step, "seen_updated_at": seen.Format(time.RFC3339Nano), "note": "card fixed"})
	r := request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/retry-from", opID), Token: token,
		Body: string(body), Header: map[string]string{"Idempotency-Key": key}}
	if key == "" {
		delete(r.Header, "Idempotency-Key")
	}
	return r
}

type retriedJSON struct {
	ID        int64     `json:"id"`
	Status    string    `json:"status"`
	Run       int       `json:"run"`
	UpdatedAt time.Time `json:"updated_at"`
	Steps     []struct {
		Name    string `json:"name"`
		Key     string `json:"key"`
		State   string `json:"state"`
		Carried *int   `json:"carried_from_run"`
	} `json:"steps"`
}

func (s *testServer) paymentsMode(t *testing.T, mode fault.Mode) {
	t.Helper()
	ctl := paymentsfake.NewControl(s.PaymentsURL, "")
	defer ctl.CloseIdleConnections()
	f := fault.Default()
	f.Mode = mode
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// A cancellation whose refund the payments service refused waits for a
// person: the provider cancelled the policy, and that stands. The desk's
// retry is refused (the same key would be refused again) and a resume too
// (it is not FAILED, and it would cancel at the provider again). A retry
// from the refund is the way on: a new run, the provider's cancellation
// carried over under its own key (never sent again), the refund under a
// new key. Every unsafe retry is refused, saying why, writing nothing.
func TestAdminRetriesARefusedRefundFromItsStep(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "5s"})
	s.paymentsMode(t, fault.ModeReject)
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "retry-0", ""))
	var stopped retriedJSON
	r.JSON(t, &stopped)
	op := stopped.ID
	stopped = retriedJSON{}
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op), Token: "demo-admin"}).JSON(t, &stopped)
	if stopped.Status != "NEEDS_RECONCILIATION" || stopped.Steps[4].Name != "refund" || stopped.Steps[4].State != "FAILED" {
		t.Fatalf("a refused refund: %+v", stopped)
	}
	seen := stopped.UpdatedAt

	// Refusals: each its own answer, nothing written.
	for _, tc := range []struct {
		name, token, key, step string
		seen                   time.Time
		status                 int
		typ                    string
	}{
		{"a customer", "demo-alice", "retry-c", "refund", seen, 403, "forbidden"},
		{"no key", "demo-admin", "", "refund", seen, 400, "idempotency-key-missing"},
		{"a step that took effect", "demo-admin", "retry-1", "provider_cancel", seen, 409, "retry-step-took-effect"},
		{"a step after the one it stopped at", "demo-admin", "retry-2", "audit", seen, 409, "retry-step-not-next"},
		{"the intent", "demo-admin", "retry-3", "record_intent", seen, 409, "retry-step-not-next"},
		{"no such step", "demo-admin", "retry-4", "refund_charge", seen, 422, "validation-failed"},
		{"a state not seen", "demo-admin", "retry-5", "refund", seen.Add(-time.Second), 409, "state-changed"},
		{"no such operation", "demo-admin", "retry-6", "refund", seen, 404, "not-found"},
	} {
		id := op
		if tc.name == "no such operation" {
			id = 999999
		}
		got := s.do(retryFromReq(id, tc.token, tc.key, tc.step, tc.seen))
		if got.Status != tc.status || got.problemType() != tc.typ {
			t.Errorf("%s: %d %s, want %d %s", tc.name, got.Status, got.Body, tc.status, tc.typ)
		}
	}
	var after retriedJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op), Token: "demo-admin"}).JSON(t, &after)
	if after.Run != 1 || !after.UpdatedAt.Equal(seen) || s.auditedRetries(t, op) != 0 {
		t.Fatalf("the refusals wrote something: run %d, updated_at %v (was %v), %d retries audited", after.Run, after.UpdatedAt, seen, s.auditedRetries(t, op))
	}

	// The customer's payment details are fixed: the refund is retried.
	s.paymentsMode(t, fault.ModeOK)
	first := s.do(retryFromReq(op, "demo-admin", "retry-7", "refund", seen))
	var retried retriedJSON
	first.JSON(t, &retried)
	if first.Status != 200 || retried.Status != "SUCCEEDED" || retried.Run != 2 {
		t.Fatalf("retry from the refund: %d %s, want 200 SUCCEEDED as run 2", first.Status, first.Body)
	}
	for _, st := range retried.Steps {
		carried := st.Name == "record_intent" || st.Name == "provider_cancel" || st.Name == "mark_cancelled" || st.Name == "publish_event"
		want := fmt.Sprintf("%d:%s:2", op, st.Name)
		if carried {
			want = fmt.Sprintf("%d:%s", op, st.Name)
		}
		if st.State != "DONE" || st.Key != want || (st.Carried != nil) != carried || (carried && *st.Carried != 1) {
			t.Errorf("step %s: %s under %s, carried from %v; want DONE under %s, carried %v", st.Name, st.State, st.Key, st.Carried, want, carried)
		}
	}
	if again := s.do(retryFromReq(op, "demo-admin", "retry-7", "refund", seen)); again.Status != 200 || !bytes.Equal(again.Body, first.Body) {
		t.Errorf("the same key again: %d, not the stored answer", again.Status)
	}
	if s.effects(t, pid) != 1 || s.refunds(t, pid) != 1 || s.auditedRetries(t, op) != 1 {
		t.Errorf("%d provider effects, %d refunds, %d retries audited; want 1 each", s.effects(t, pid), s.refunds(t, pid), s.auditedRetries(t, op))
	}
	// Finished: nothing to retry.
	var done retriedJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op), Token: "demo-admin"}).JSON(t, &done)
	if r := s.do(retryFromReq(op, "demo-admin", "retry-8", "refund", done.UpdatedAt)); r.Status != 409 || r.problemType() != "retry-not-stopped" {
		t.Errorf("retrying a SUCCEEDED operation: %d %s", r.Status, r.Body)
	}
	s.assertInvariants(t)
}

func (s *testServer) auditedRetries(t *testing.T, opID int64) int {
	t.Helper()
	var n int
	if err := s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM reconciliation_decisions WHERE operation_id = $1 AND decision = 'retry_from'`, opID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *testServer) refunds(t *testing.T, policyID int64) int {
	t.Helper()
	var n int
	if err := s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM fake_payments.ledger WHERE kind = 'refund' AND policy_id = $1`, policyID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The exit a person needs when an admin cancelled a cancellation while its
// refund was on its way and payments never got it: recovery learns the
// refund NOT_STARTED, the provider's cancellation stands and nothing undoes
// it, so a person decides. The desk's retry sets the cancel aside — the
// workflow runs on — and recovery sends the refund (same key: it never took
// effect): SUCCEEDED, one refund. (Kept, the cancel would stop it at the
// refund again and hand it back, forever: the chaos run found it.)
func TestDeskRetryOfACancelledRefundRunsTheWorkflowOn(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms",
		"RECOVERY_MAX_ATTEMPTS": "100", "RECOVERY_MAX_BACKOFF": "500ms"})
	s.paymentsMode(t, fault.ModeDrop)
	pid := s.policyOf(t, "demo-alice", 0)
	var live retriedJSON
	if r := s.do(cancelReq(pid, "demo-alice", "desk-0", "")); r.Status != 202 {
		t.Fatalf("cancel with payments dropping: %d %s", r.Status, r.Body)
	} else {
		r.JSON(t, &live)
	}
	if r := s.do(cancelOpReq(live.ID, "demo-admin", "desk-stop")); r.Status != 202 {
		t.Fatalf("cancel the operation: %d %s", r.Status, r.Body)
	}
	s.paymentsMode(t, fault.ModeOK)
	waiting := s.until(t, live.ID, 30*time.Second, func(op cancelledJSON) bool { return op.Status == "NEEDS_RECONCILIATION" })
	if stepState(waiting, "provider_cancel") != "DONE" || stepState(waiting, "refund") == "DONE" || s.refunds(t, pid) != 0 {
		t.Fatalf("cancelled at the refund: %+v, %d refunds", waiting.Steps, s.refunds(t, pid))
	}
	var seen retriedJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", live.ID), Token: "demo-admin"}).JSON(t, &seen)
	body, _ := json.Marshal(map[string]any{"action": "retry", "seen_updated_at": seen.UpdatedAt.Format(time.RFC3339Nano), "note": "the customer is owed the refund"})
	if r := s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/resolve", live.ID), Token: "demo-admin",
		Body: string(body), Header: map[string]string{"Idempotency-Key": "desk-retry"}}); r.Status != 200 {
		t.Fatalf("the desk's retry: %d %s", r.Status, r.Body)
	}
	done := s.until(t, live.ID, 30*time.Second, func(op cancelledJSON) bool { return op.Status != "IN_PROGRESS" && op.Status != "RECOVERING" })
	if done.Status != "SUCCEEDED" || done.CancelRequestedAt != nil || s.refunds(t, pid) != 1 || s.effects(t, pid) != 1 {
		t.Fatalf("after the desk's retry: %s (cancel %v), %d refunds, %d provider effects; want SUCCEEDED, the cancel set aside, 1 and 1",
			done.Status, done.CancelRequestedAt, s.refunds(t, pid), s.effects(t, pid))
	}
	s.assertInvariants(t)
}
