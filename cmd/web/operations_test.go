package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/operations"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

type operationsListJSON struct {
	Items []struct {
		ID     int64  `json:"id"`
		Kind   string `json:"operation_type"`
		User   string `json:"user"`
		Status string `json:"status"`
		URL    string `json:"url"`
	} `json:"items"`
	NextCursor *string `json:"next_cursor"`
	Counts     []struct {
		Status string `json:"status"`
		Count  int    `json:"count"`
	} `json:"counts"`
}

// A keyed POST whose outcome is unknown, sent with Prefer: wait=N, answers
// once recovery has finished the operation: its stored 202 and body, byte
// for byte as every replay, and the operation's final status in a header.
// The list shows the operation to its owner and the admin, not to others.
func TestWaitForAnOutcomeAndListOperations(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "200ms"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	pid := s.policyOf(t, "demo-alice", 0)

	req := cancelReq(pid, "demo-alice", "wait-1", `{"reason":"moving"}`)
	req.Header["Prefer"] = "wait=20"
	start := time.Now()
	first := s.do(req)
	if first.Status != 202 {
		t.Fatalf("POST cancel: %d %s, want 202", first.Status, first.Body)
	}
	if got := first.Header.Get("Operation-Status"); got != "SUCCEEDED" {
		t.Fatalf("Operation-Status %q after %v, want SUCCEEDED (recovery finishes it within the wait)", got, time.Since(start))
	}
	if got := first.Header.Get("Preference-Applied"); got != "wait=20" {
		t.Errorf("Preference-Applied %q, want wait=20", got)
	}
	var op operationJSON
	first.JSON(t, &op)
	if op.Status != "IN_PROGRESS" {
		t.Errorf("the stored body says %s, want IN_PROGRESS (the answer the request committed)", op.Status)
	}

	// A replay, without waiting: the same status and bytes, the state now.
	delete(req.Header, "Prefer")
	again := s.do(req)
	if again.Status != 202 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %s, first %d %s", again.Status, again.Body, first.Status, first.Body)
	}
	if got := again.Header.Get("Operation-Status"); got != "SUCCEEDED" || again.Header.Get("Preference-Applied") != "" {
		t.Errorf("replay: Operation-Status %q, Preference-Applied %q", got, again.Header.Get("Preference-Applied"))
	}

	// Waiting on a live operation runs out and says where it stands.
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeSlow; f.SlowMS = 60000 })
	bobs := s.policyOf(t, "demo-bob", 0)
	r := s.do(cancelReq(bobs, "demo-bob", "wait-2", ""))
	var live operationJSON
	r.JSON(t, &live)
	get := request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", live.ID), Token: "demo-bob",
		Header: map[string]string{"Prefer": "respond-async, wait=1"}}
	start = time.Now()
	g := s.do(get)
	g.JSON(t, &live)
	if g.Status != 200 || live.Status == "SUCCEEDED" || time.Since(start) < time.Second || g.Header.Get("Preference-Applied") != "wait=1" {
		t.Errorf("GET with wait=1: %d %s after %v, Preference-Applied %q", g.Status, live.Status, time.Since(start), g.Header.Get("Preference-Applied"))
	}
	// Someone else's operation: 404 at once, no wait.
	get.Token = "demo-alice"
	if g := s.do(get); g.Status != 404 || g.Header.Get("Preference-Applied") != "" {
		t.Errorf("alice waiting on bob's operation: %d, Preference-Applied %q", g.Status, g.Header.Get("Preference-Applied"))
	}

	// The list: each customer their own, the admin everyone's.
	for token, want := range map[string]int{"demo-alice": 1, "demo-bob": 1, "demo-admin": 2} {
		var list operationsListJSON
		s.do(request{Method: "GET", Path: "/api/v1/operations", Token: token}).JSON(t, &list)
		if len(list.Items) != want {
			t.Errorf("%s lists %d operations, want %d", token, len(list.Items), want)
		}
		if len(list.Counts) != 5 {
			t.Errorf("%s: counts %+v", token, list.Counts)
		}
	}
	var succeeded operationsListJSON
	s.do(request{Method: "GET", Path: "/api/v1/operations?status=SUCCEEDED&kind=CANCEL&user=alice", Token: "demo-admin"}).JSON(t, &succeeded)
	if len(succeeded.Items) != 1 || succeeded.Items[0].ID != op.ID || succeeded.Items[0].URL != fmt.Sprintf("/api/v1/operations/%d", op.ID) {
		t.Errorf("SUCCEEDED cancellations of alice: %+v", succeeded.Items)
	}
	for _, q := range []string{"status=DONE", "kind=REFUND", "since=yesterday", "waiting_on=Provider!", "limit=0"} {
		if r := s.do(request{Method: "GET", Path: "/api/v1/operations?" + q, Token: "demo-admin"}); r.Status != 400 || r.problemType() != "invalid-parameter" {
			t.Errorf("?%s: %d %s, want 400 invalid-parameter", q, r.Status, r.Body)
		}
	}
}

// Retention purges a SUCCEEDED cancellation with everything hanging from
// it. What still stops a second cancellation of the policy is the policy's
// own status: the cancellation's INSERT takes only an ACTIVE policy, so a
// new key finds no such policy (404) — UNIQUE(policy_id, operation_type)
// has no row left to conflict with. The provider is never called again.
func TestAPurgedCancellationStaysCancelled(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	ctx := context.Background()
	pid := s.policyOf(t, "demo-alice", 0)
	if r := s.do(cancelReq(pid, "demo-alice", "purge-1", "")); r.Status != 200 {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	// Before the purge, the business identity answers a new key, and says
	// which rule refused it: a SUCCEEDED operation never runs again.
	dup := s.do(cancelReq(pid, "demo-alice", "purge-dup", ""))
	var refusal struct {
		Type string `json:"type"`
		Rule string `json:"rule"`
	}
	dup.JSON(t, &refusal)
	if dup.Status != 409 || refusal.Type != "duplicate-intent" || refusal.Rule != "reuse-failed-only" {
		t.Fatalf("a second key before the purge: %d %s, want 409 duplicate-intent, rule reuse-failed-only", dup.Status, dup.Body)
	}
	// A month and a day pass.
	for _, q := range []string{
		`UPDATE operations SET finished_at = finished_at - interval '31 days' WHERE policy_id = $1`,
		`UPDATE policies SET updated_at = updated_at - interval '31 days' WHERE id = $1`,
	} {
		if _, err := s.DB.Pool.Exec(ctx, q, pid); err != nil {
			t.Fatal(err)
		}
	}
	purged, err := operations.NewJanitor(s.DB.Pool, operations.JanitorConfig{}).RunOnce(ctx)
	if err != nil || purged != 1 {
		t.Fatalf("janitor: purged %d, %v; want the one cancellation", purged, err)
	}
	r := s.do(cancelReq(pid, "demo-alice", "purge-2", ""))
	if r.Status != 404 {
		t.Fatalf("a second cancellation after the purge: %d %s, want 404 (no ACTIVE policy)", r.Status, r.Body)
	}
	if n := s.effects(t, pid); n != 1 {
		t.Errorf("provider effects %d, want 1", n)
	}
	var pol policyJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/policies/%d", pid), Token: "demo-alice"}).JSON(t, &pol)
	if pol.Status != "CANCELLED" {
		t.Errorf("policy %s, want CANCELLED", pol.Status)
	}
	// Invariant 4 speaks only for policies cancelled within the retention:
	// older ones have no operation left to check against.
	rep, err := invariants.Check(ctx, s.DB.Pool, invariants.Options{Retention: 30 * 24 * time.Hour})
	if err != nil || !rep.OK {
		t.Errorf("invariants with the retention: %v %+v", err, rep.Violations)
	}
	if rep, _ := invariants.Check(ctx, s.DB.Pool, invariants.Options{}); rep.OK {
		t.Errorf("invariants without a retention hold for a CANCELLED policy with no cancellation left")
	}
}

func resumeReq(opID int64, token, key string) request {
	return request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/resume", opID), Token: token,
		Header: map[string]string{"Idempotency-Key": key}}
}

// An admin resumes a FAILED cancellation as its next run: new step keys,
// so the provider sees a new request, not a repeat of the refused one. The
// rules: admins only; only a FAILED operation; not a deposit booking (its
// slot was released); keyed like every write.
func TestAdminResumesAFailedOperation(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "5s"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeReject })
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "resume-0", ""))
	var refused struct {
		OperationID int64 `json:"operation_id"`
	}
	r.JSON(t, &refused)
	if r.Status != 422 || refused.OperationID == 0 {
		t.Fatalf("cancel with the provider refusing: %d %s", r.Status, r.Body)
	}
	op := refused.OperationID

	if r := s.do(resumeReq(op, "demo-alice", "resume-alice")); r.Status != 403 {
		t.Errorf("a customer resuming: %d, want 403", r.Status)
	}
	s.setFaults(t, func(f *fake.Fault) {})
	first := s.do(resumeReq(op, "demo-admin", "resume-1"))
	var resumed struct {
		Status string `json:"status"`
		Run    int    `json:"run"`
		Steps  []struct {
			Key string `json:"key"`
		} `json:"steps"`
	}
	first.JSON(t, &resumed)
	if first.Status != 200 || resumed.Status != "SUCCEEDED" || resumed.Run != 2 || resumed.Steps[1].Key != fmt.Sprintf("%d:provider_cancel:2", op) {
		t.Fatalf("resume: %d %s; want 200 SUCCEEDED as run 2 under new step keys", first.Status, first.Body)
	}
	if again := s.do(resumeReq(op, "demo-admin", "resume-1")); again.Status != 200 || !bytes.Equal(again.Body, first.Body) {
		t.Errorf("the same key again: %d, not the stored answer", again.Status)
	}
	var pol policyJSON
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/policies/%d", pid), Token: "demo-alice"}).JSON(t, &pol)
	if pol.Status != "CANCELLED" || s.effects(t, pid) != 1 {
		t.Errorf("policy %s with %d effects, want CANCELLED with 1", pol.Status, s.effects(t, pid))
	}
	// Not FAILED any more: a new key is refused, saying what it is.
	r = s.do(resumeReq(op, "demo-admin", "resume-2"))
	var p struct {
		Type   string `json:"type"`
		Status string `json:"operation_status"`
	}
	r.JSON(t, &p)
	if r.Status != 409 || p.Type != "not-failed" || p.Status != "SUCCEEDED" {
		t.Errorf("resuming a SUCCEEDED operation: %d %s", r.Status, r.Body)
	}
	if r := s.do(resumeReq(999999, "demo-admin", "resume-3")); r.Status != 404 {
		t.Errorf("resuming no operation: %d", r.Status)
	}

	// A failed deposit booking is not resumed.
	ctl := paymentsfake.NewControl(s.PaymentsURL, "")
	defer ctl.CloseIdleConnections()
	f := fault.Default()
	f.Mode = fault.ModeReject
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	b := s.book("demo-bob", depositSlot(t, s.DB, 0), "resume-deposit", "")
	var declined struct {
		OperationID int64 `json:"operation_id"`
	}
	b.JSON(t, &declined)
	if b.Status != 402 || declined.OperationID == 0 {
		t.Fatalf("a declined deposit: %d %s", b.Status, b.Body)
	}
	if r := s.do(resumeReq(declined.OperationID, "demo-admin", "resume-4")); r.Status != 409 || r.problemType() != "resume-not-allowed" {
		t.Errorf("resuming a failed deposit booking: %d %s", r.Status, r.Body)
	}
}

// A resume asks first (third read): a cancellation whose provider call's
// outcome nobody knew was marked failed — by a person at the desk, whose
// decision leaves the step as it was (SENT or UNKNOWN) — although the
// provider had applied it; resuming it sent the call again under run 2's
// key and cancelled the policy twice. Now the resume asks the provider
// about run 1's key first and refuses while it says COMPLETED: one effect.
func TestAResumeAsksFirstWhetherTheStoppedCallTookEffect(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "1h"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "ask-first-0", ""))
	if r.Status != 202 {
		t.Fatalf("cancel with the answer lost: %d %s, want 202", r.Status, r.Body)
	}
	waitUntil(t, time.Minute, func() bool { return s.effects(t, pid) == 1 })
	// What a person's "Mark failed" leaves (workflow.Person.Fail): the
	// operation FAILED, the step's outcome still unknown.
	var op int64
	if err := s.DB.Pool.QueryRow(context.Background(), `
		UPDATE operations
		   SET status = 'FAILED', owner_token = NULL, lease_expires_at = NULL, finished_at = now(), updated_at = now(),
		       last_error = 'a person found the provider never applied it'
		 WHERE policy_id = $1
		RETURNING id`, pid).Scan(&op); err != nil {
		t.Fatal(err)
	}
	s.setFaults(t, func(f *fake.Fault) {}) // the provider healthy again: the resume's call would go through
	r = s.do(resumeReq(op, "demo-admin", "ask-first-resume"))
	var p struct {
		Type string `json:"type"`
		Step string `json:"step"`
	}
	if r.Status != 409 {
		t.Fatalf("resume of a run whose call took effect: %d %s %v; want 409 retry-step-took-effect", r.Status, r.Body, r.Header)
	}
	r.JSON(t, &p)
	if r.Status != 409 || !strings.HasSuffix(p.Type, "retry-step-took-effect") || p.Step != "provider_cancel" {
		t.Fatalf("resume of a run whose call took effect: %d %s; want 409 retry-step-took-effect at provider_cancel", r.Status, r.Body)
	}
	if n := s.effects(t, pid); n != 1 {
		t.Fatalf("%d provider effects after the resume, want 1", n)
	}
}
