package workflow_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/recovery/recoverytest"
	"github.com/idemlab/idemlab/internal/workflow"
)

// These are the recovery decision tree's tests (recover.go): every provider
// and payments mode × every crash point of a cancellation ends, after
// recovery, in its documented state through its documented branch; a
// not-idempotent system is never called blind; a person is the last resort.
// They run recovery as the loop does (internal/recovery/recoverytest).

// Every provider mode × every crash point of a cancellation ends, after
// recovery with the faults switched off, in the documented terminal state
// (docs/cancellation.md) with at most one provider effect — exactly one
// when it succeeded.
func TestEveryModeAndCrashPointEndsInItsDocumentedState(t *testing.T) {
	t.Parallel()
	type want struct {
		status  string
		effects int
		branch  string // the branch recovery took; "" = nothing to recover
	}
	var (
		succeeded     = want{workflow.StatusSucceeded, 1, ""}
		failed        = want{workflow.StatusFailed, 0, ""}
		afterRetry    = want{workflow.StatusSucceeded, 1, workflow.BranchNotStarted}
		afterAsking   = want{workflow.StatusSucceeded, 1, workflow.BranchCompleted}
		refusedAsking = want{workflow.StatusFailed, 0, workflow.BranchRejected}
	)
	// atTheEnd is how a request that ran to its end leaves each mode.
	atTheEnd := map[fake.Mode]want{
		fake.ModeOK: succeeded, fake.ModeReject: failed, fake.ModeError: afterRetry, fake.ModeDrop: afterRetry,
		fake.ModeLostResponse: afterAsking, fake.ModeSlow: afterAsking,
	}
	// afterTheCall is how recovery finds each mode when the request died
	// after calling, before recording: it asks, and acts on the truth.
	afterTheCall := map[fake.Mode]want{
		fake.ModeOK: afterAsking, fake.ModeReject: refusedAsking, fake.ModeError: afterRetry, fake.ModeDrop: afterRetry,
		fake.ModeLostResponse: afterAsking, fake.ModeSlow: afterAsking,
	}
	expect := func(mode fake.Mode, point crash.Point) (want, bool) {
		switch point {
		case "after_record_intent":
			return want{}, false // nothing committed: no operation; the client's retry runs afresh
		case "before_provider_cancel":
			return afterRetry, true // the call was never made, whatever the mode would have done
		case "after_provider_cancel":
			return afterTheCall[mode], true
		case "after_mark_cancelled", "after_publish_event":
			if mode == fake.ModeOK { // reached only once the provider confirmed; the transaction rolled back
				return afterAsking, true
			}
		case "before_refund":
			if mode == fake.ModeOK { // the policy is cancelled; the refund never sent
				return afterRetry, true
			}
		case "after_refund", "after_audit":
			if mode == fake.ModeOK { // the refund made, its outcome (and audit) rolled back or never recorded
				return afterAsking, true
			}
		}
		return atTheEnd[mode], true // recoverytest.None, after_commit, and the points a mode never reaches
	}
	for _, mode := range []fake.Mode{fake.ModeOK, fake.ModeReject, fake.ModeError, fake.ModeDrop, fake.ModeLostResponse, fake.ModeSlow} {
		for _, point := range append([]crash.Point{recoverytest.None}, canonical(policies.CrashPoints)...) {
			t.Run(fmt.Sprintf("%s/%s", mode, point), func(t *testing.T) {
				t.Parallel()
				b := recoverytest.Setup(t)
				pid := b.PolicyIDs[0]
				if mode == fake.ModeOK || mode == fake.ModeReject {
					// A definite answer is waited for. (An error answer's
					// step keeps the short deadline: recovery's wait for it
					// to pass is part of what the case shows.)
					b.PatientRequests(t, b.Timeout)
				}
				b.SetFaults(t, recoverytest.Faults{Mode: mode, Idempotent: true})
				before, err := b.CancelCrashingAt(t, pid, point)
				w, exists := expect(mode, point)
				if !exists {
					if !errors.Is(err, workflow.ErrNotFound) {
						t.Fatalf("crashed before the first commit, yet: %+v %v", before, err)
					}
					// The client retries with the same key: it runs afresh.
					b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true})
					op, err := b.Canceller.Cancel(context.Background(), policies.CancelRequest{UserID: b.Alice, PolicyID: pid,
						RequestKey: "key-" + string(point), Actor: "the retry"}, workflow.Hooks[workflow.Operation]{})
					if err != nil || op.Status != workflow.StatusSucceeded || b.Effects(t, pid) != 1 {
						t.Fatalf("retry: %+v %v, effects %d", op, err, b.Effects(t, pid))
					}
					recoverytest.CheckInvariants(t, b.DB)
					return
				}
				if err != nil {
					t.Fatal(err)
				}

				b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true}) // faults off
				l := b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls = 6 })
				// A crashed request's 30s lease has not run out yet: recovery
				// leaves the operation alone until it does…
				// (a handed-over one is claimed at once).
				first, err := l.RunOnce(context.Background())
				if err != nil || (before.LeaseExpiresAt.After(time.Now().Add(time.Second)) && first.Claimed != 0) {
					t.Fatalf("first pass claimed %+v (%v) an operation whose lease was running", first, err)
				}
				// …then takes it over (time moved past the lease, not slept).
				l.Engine.Clock().Set(time.Now().Add(31 * time.Second))
				counts := recoverytest.Add(first, b.Settle(t, l))

				op := b.Operation(t, pid)
				if op.Status != w.status {
					t.Errorf("status %s, want %s (last error %v)", op.Status, w.status, recoverytest.Deref(op.LastError))
				}
				if got := b.Effects(t, pid); got != w.effects {
					t.Errorf("provider effects %d, want %d", got, w.effects)
				}
				if got, want := b.Refunds(t, pid), w.effects; got != want { // a refund exactly when cancelled
					t.Errorf("refunds %d, want %d", got, want)
				}
				branches := b.Branches(t, op.ID)
				if w.branch == "" && counts.Claimed != 0 {
					t.Errorf("recovery claimed a finished operation: %+v, branches %v", counts, branches)
				}
				if w.branch != "" && (counts.Claimed != 1 || !slices.Contains(branches, w.branch)) {
					t.Errorf("claims %d, branches %v; want one claim and branch %s", counts.Claimed, branches, w.branch)
				}
				if op.Status == workflow.StatusSucceeded {
					for _, s := range op.Steps {
						if s.State != workflow.StepDone {
							t.Errorf("SUCCEEDED with step %s %s", s.Name, s.State)
						}
					}
				}
				recoverytest.CheckInvariants(t, b.DB)
			})
		}
	}
}

// canonical drops the older alias names from a list of crash points.
func canonical(points []crash.Point) []crash.Point {
	var out []crash.Point
	for _, p := range points {
		if p != "after_claim" && p != "after_provider_call" {
			out = append(out, p)
		}
	}
	return out
}

// A provider that is not idempotent lost its answer, and its status cannot
// be asked: recovery must not call again (that could cancel twice). It
// backs off and asks again (issue 11: a person is the last resort), and
// only once its attempts are used — right after a last status query that
// still cannot be answered — does the operation go to reconciliation. The
// effect count stays 1.
func TestNotIdempotentLostResponseGoesToReconciliation(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeLostResponse, Idempotent: false})
	op, _ := b.CancelCrashingAt(t, pid, recoverytest.None)
	if op.Status != workflow.StatusInProgress {
		t.Fatalf("after a lost response: %s", op.Status)
	}
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false, StatusMode: fake.StatusError})
	b.Believe(t, false)
	l := b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 2, 3 })
	c := b.Settle(t, l)
	op = b.Operation(t, pid)
	if op.Status != workflow.StatusNeedsReconciliation || c.Reconcile != 1 || c.BackedOff != 2 {
		t.Fatalf("status %s, counts %+v; want NEEDS_RECONCILIATION after two backoffs", op.Status, c)
	}
	if got := b.Effects(t, pid); got != 1 {
		t.Fatalf("effects %d, want 1", got)
	}
	if op.LastError == nil || !strings.Contains(*op.LastError, "last status query") {
		t.Errorf("evidence missing: last_error %v", recoverytest.Deref(op.LastError))
	}
	calls, _ := readmodel.Calls(context.Background(), b.DB.Pool, op.ID)
	var sends, asks int
	for _, cr := range calls {
		switch cr.Kind {
		case "call":
			sends++
		case "status":
			asks++
		}
	}
	if sends != 1 || asks < 3 {
		t.Errorf("calls %d (want only the request's), status queries %d", sends, asks)
	}
	// The belief in force is on the timeline.
	events, _ := readmodel.Timeline(context.Background(), b.DB.Pool, op.ID)
	named := false
	for _, e := range events {
		named = named || strings.Contains(e.Detail, "believes provider calls are NOT idempotent")
	}
	if !named {
		t.Error("no timeline event names the belief that decided")
	}
	// The timeline's count of status queries is the Calls table's, attempt
	// by attempt (third read, finding 8: "after 5 polls" beside six rows).
	perAttempt := map[string]int{}
	for _, cr := range calls {
		if cr.Kind == "status" && cr.OwnerToken != nil {
			perAttempt[*cr.OwnerToken]++
		}
	}
	said := 0
	for _, e := range events {
		var n, polls int
		if _, err := fmt.Sscanf(e.Detail, "after %d status queries (the first question, then %d polls)", &n, &polls); err != nil || e.OwnerToken == nil {
			continue
		}
		said++
		if got := perAttempt[*e.OwnerToken]; got != n || polls != n-1 {
			t.Errorf("the timeline says %q; the Calls table lists %d status queries for that attempt", e.Detail, got)
		}
	}
	if said == 0 {
		t.Error("no timeline line counts the status queries of an attempt that polled to its limit")
	}
	// It is asked again later, not before.
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("a NEEDS_RECONCILIATION operation was asked again at once: %+v", c)
	}
	recoverytest.CheckInvariants(t, b.DB)
}

// The same lost answer on a provider whose status can be asked: recovery
// asks first, learns COMPLETED, and finishes without a second call.
func TestNotIdempotentLostResponseWithStatusFinishesWithoutASecondCall(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeLostResponse, Idempotent: false})
	b.CancelCrashingAt(t, pid, recoverytest.None)
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false})
	b.Believe(t, false)
	b.Settle(t, b.Loop(t, "app-2", nil))
	op := b.Operation(t, pid)
	if op.Status != workflow.StatusSucceeded || b.Effects(t, pid) != 1 {
		t.Fatalf("status %s, effects %d", op.Status, b.Effects(t, pid))
	}
	recoverytest.CheckInvariants(t, b.DB)
}

// A provider that cannot be reached at all: each attempt backs off (the
// operation stays RECOVERING with a next attempt time), and once the
// attempts are used it goes to reconciliation with the evidence.
func TestUnreachableProviderBacksOffThenReconciles(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeDrop, Idempotent: true, StatusMode: fake.StatusError})
	b.CancelCrashingAt(t, pid, recoverytest.None) // attempt 1: the request's own, handed over
	l := b.Loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.Backoff, c.MaxBackoff = 1, 3, time.Hour, 2*time.Hour
	})

	c, err := l.RunOnce(context.Background())
	if err != nil || c.BackedOff != 1 {
		t.Fatalf("first pass %+v %v; want a backoff", c, err)
	}
	op := b.Operation(t, pid)
	if op.Status != workflow.StatusRecovering || op.Attempts != 2 || op.NextAttemptAt == nil || time.Until(*op.NextAttemptAt) < 30*time.Minute {
		t.Fatalf("after a backoff: %s attempts %d next %v", op.Status, op.Attempts, op.NextAttemptAt)
	}
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("claimed during its backoff: %+v", c)
	}
	l.Engine.Clock().Set(time.Now().Add(3 * time.Hour))
	if c, err = l.RunOnce(context.Background()); err != nil || c.BackedOff != 1 {
		t.Fatalf("second attempt %+v %v; want another backoff", c, err)
	}
	l.Engine.Clock().Set(time.Now().Add(6 * time.Hour))
	if c, err = l.RunOnce(context.Background()); err != nil || c.Reconcile != 1 {
		t.Fatalf("third attempt %+v %v; want reconciliation", c, err)
	}
	op = b.Operation(t, pid)
	if op.Status != workflow.StatusNeedsReconciliation || op.Attempts != 3 || op.NextAttemptAt == nil {
		t.Fatalf("%s attempts %d, next question %v", op.Status, op.Attempts, op.NextAttemptAt)
	}
	if got := b.Branches(t, op.ID); !slices.Contains(got, workflow.BranchBackoff) || got[len(got)-1] != workflow.BranchReconciliation {
		t.Fatalf("branches %v", got)
	}
}

// A recoverytest.Worker whose lease ran out while it polled (a long GC pause, a
// partition) is fenced: another recoverytest.Worker claims the operation, and nothing
// the first one tries to write afterwards lands.
func TestAWorkerWhoseLeaseLapsedMidPollIsFenced(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	pid := b.PolicyIDs[0]
	fault := fake.DefaultFault()
	fault.Mode, fault.SlowMS = fake.ModeSlow, 2000
	if _, err := b.Fake.SetFaults(ctx, fault); err != nil {
		t.Fatal(err)
	}
	op, _ := b.CancelCrashingAt(t, pid, recoverytest.None) // RUNNING at the provider for 2s; handed over
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true})

	// A waits long between polls, so B takes over inside A's first wait
	// however slow the machine is; B polls briskly until the provider
	// completes. When A wakes up, the operation is no longer its own.
	a := b.Loop(t, "app-1", func(c *recovery.Config) { c.Lease, c.MaxPolls, c.PollInterval = time.Second, 10, 3*time.Second })
	bb := b.Loop(t, "app-2", func(c *recovery.Config) { c.Lease, c.MaxPolls, c.PollInterval = time.Second, 10, 150*time.Millisecond })
	aDone := make(chan recovery.Counts, 1)
	go func() {
		c, err := a.RunOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		aDone <- c
	}()
	// Wait until recoverytest.Worker A is polling…
	recoverytest.WaitFor(t, 5*time.Second, func() bool {
		var n int
		b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE operation_id = $1 AND branch = 'poll'`, op.ID).Scan(&n)
		return n > 0
	})
	// …then B, whose clock says A's lease is long over, takes over.
	bb.Engine.Clock().Set(time.Now().Add(time.Hour))
	cb, err := bb.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ca := <-aDone
	if cb.Claimed != 1 || cb.Succeeded != 1 || ca.Fenced != 1 || ca.Succeeded != 0 {
		t.Fatalf("A %+v, B %+v; want A fenced and B finishing", ca, cb)
	}
	var takeover int64
	b.DB.Pool.QueryRow(ctx, `SELECT id FROM operation_events WHERE operation_id = $1 AND branch = 'claimed' AND actor = 'recovery on app-2'`, op.ID).Scan(&takeover)
	// After the takeover, A's only line on the timeline is its refusal.
	var lateWrites, refusals int
	b.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE branch IS DISTINCT FROM 'fenced'), count(*) FILTER (WHERE branch = 'fenced')
		  FROM operation_events
		 WHERE operation_id = $1 AND id > $2 AND actor = 'recovery on app-1'`, op.ID, takeover).Scan(&lateWrites, &refusals)
	if takeover == 0 || lateWrites != 0 || refusals != 1 {
		t.Fatalf("takeover event %d, writes by A after it: %d, refusals recorded: %d", takeover, lateWrites, refusals)
	}
	final := b.Operation(t, pid)
	if final.Status != workflow.StatusSucceeded || b.Effects(t, pid) != 1 {
		t.Fatalf("%s, effects %d", final.Status, b.Effects(t, pid))
	}
	recoverytest.CheckInvariants(t, b.DB)
}

// A person is the last resort (issue 11, item 4): an operation waiting for
// one is asked again when due. While its truth stays unknown nothing a
// person is looking at changes (status and updated_at stay; the question is
// in operation_calls); once the truth is known, recovery takes it back and
// finishes it — and a person's decision made first would stand instead.
func TestAnOperationWaitingForAPersonIsAskedAgainAndFinished(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeLostResponse, Idempotent: false})
	b.CancelCrashingAt(t, pid, recoverytest.None)
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false, StatusMode: fake.StatusError})
	b.Believe(t, false)
	l := b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts, c.ReaskInterval = 1, 1, time.Minute })
	b.Settle(t, l)
	waiting := b.Operation(t, pid)
	if waiting.Status != workflow.StatusNeedsReconciliation || waiting.NextAttemptAt == nil {
		t.Fatalf("not waiting for a person with a next question: %+v", waiting)
	}
	// Not due yet: nothing asked.
	if c, _ := l.RunOnce(ctx); c.Claimed != 0 {
		t.Fatalf("asked before it was due: %+v", c)
	}
	asked := func() int {
		var n int
		b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_calls WHERE operation_id = $1 AND kind = 'status'`, waiting.ID).Scan(&n)
		return n
	}
	before := asked()

	// Due, the provider still cannot be asked: it keeps waiting, untouched.
	l.Engine.Clock().Set(time.Now().Add(2 * time.Minute))
	c, err := l.RunOnce(ctx)
	if err != nil || c.Reasked != 1 {
		t.Fatalf("re-ask pass %+v %v", c, err)
	}
	still := b.Operation(t, pid)
	if still.Status != workflow.StatusNeedsReconciliation || !still.UpdatedAt.Equal(waiting.UpdatedAt) || asked() != before+1 {
		t.Fatalf("after an unanswered question: %s, updated_at %s (was %s), questions %d (was %d)",
			still.Status, still.UpdatedAt, waiting.UpdatedAt, asked(), before)
	}
	if !still.NextAttemptAt.After(*waiting.NextAttemptAt) {
		t.Errorf("next question %s, not after %s", still.NextAttemptAt, waiting.NextAttemptAt)
	}

	// The provider answers again: COMPLETED. Recovery finishes it: the
	// refund, the audit, SUCCEEDED — one cancellation, one refund.
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false})
	l.Engine.Clock().Set(time.Now().Add(time.Hour))
	if c, err = l.RunOnce(ctx); err != nil || c.Succeeded != 1 {
		t.Fatalf("second re-ask %+v %v", c, err)
	}
	done := b.Operation(t, pid)
	if done.Status != workflow.StatusSucceeded || b.Effects(t, pid) != 1 || b.Refunds(t, pid) != 1 {
		t.Fatalf("after the truth came back: %s, effects %d, refunds %d", done.Status, b.Effects(t, pid), b.Refunds(t, pid))
	}
	if got := b.Branches(t, done.ID); !slices.Contains(got, workflow.BranchReasked) {
		t.Fatalf("branches %v", got)
	}
	recoverytest.CheckInvariants(t, b.DB)
}

// The questions to an operation waiting for a person come at the re-ask
// interval, doubling from when it began to wait — not from its attempts: a
// chaos run's operations that came to a person after 9 attempts (of 5)
// were asked once after 30 s and then only after 5 minutes, and the drain
// found them still waiting with their truth long known.
func TestReaskingCountsFromWhenTheWaitBegan(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeLostResponse, Idempotent: false})
	b.CancelCrashingAt(t, pid, recoverytest.None)
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false, StatusMode: fake.StatusError})
	b.Believe(t, false)
	l := b.Loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.ReaskInterval, c.MaxBackoff = 1, 1, time.Minute, time.Hour
	})
	b.Settle(t, l)
	waiting := b.Operation(t, pid)
	if waiting.Status != workflow.StatusNeedsReconciliation || waiting.NextAttemptAt == nil {
		t.Fatalf("not waiting for a person with a next question: %+v", waiting)
	}
	// It came to a person after many attempts, as in the chaos run.
	if _, err := b.DB.Pool.Exec(ctx, `UPDATE operations SET attempts = 9 WHERE id = $1`, waiting.ID); err != nil {
		t.Fatal(err)
	}

	// Due; the provider still cannot be asked: the next question comes one
	// interval later (it has waited less than one), not 2^8 intervals.
	l.Engine.Clock().Set(time.Now().Add(2 * time.Minute))
	asked := time.Now()
	if c, err := l.RunOnce(ctx); err != nil || c.Reasked != 1 {
		t.Fatalf("re-ask pass %+v %v", c, err)
	}
	still := b.Operation(t, pid)
	if still.Status != workflow.StatusNeedsReconciliation || still.NextAttemptAt == nil {
		t.Fatalf("after an unanswered question: %+v", still)
	}
	if next := still.NextAttemptAt.Sub(asked); next > 2*time.Minute {
		t.Fatalf("next question %s after the first; want about the re-ask interval (1m): it has waited only seconds", next.Round(time.Second))
	}

	// Waiting since 20 minutes: the next question 20 minutes on (doubling).
	if _, err := b.DB.Pool.Exec(ctx, `UPDATE operations SET updated_at = now() - interval '20 minutes', next_attempt_at = now() WHERE id = $1`, waiting.ID); err != nil {
		t.Fatal(err)
	}
	asked = time.Now()
	if c, err := l.RunOnce(ctx); err != nil || c.Reasked != 1 {
		t.Fatalf("second re-ask pass %+v %v", c, err)
	}
	still = b.Operation(t, pid)
	if next := still.NextAttemptAt.Sub(asked); next < 19*time.Minute || next > 22*time.Minute {
		t.Fatalf("after 20 minutes of waiting the next question comes %s later; want about 20m", next.Round(time.Second))
	}
}

// One last status query precedes every hand-over to a person: the event
// that sends the operation to reconciliation is preceded, in the log of
// calls, by a status query made by the same recoverytest.Worker after its last call.
// And with a provider that cannot be asked and is not believed idempotent,
// recovery backs off and asks again before a person is involved.
func TestEveryHandOverToAPersonFollowsAStatusQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		idempotent bool
	}{{"not idempotent: back off, ask again", false}, {"idempotent: the same call, then ask", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := recoverytest.Setup(t)
			ctx := context.Background()
			pid := b.PolicyIDs[0]
			b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeDrop, Idempotent: tc.idempotent, StatusMode: fake.StatusError})
			b.Believe(t, tc.idempotent)
			b.CancelCrashingAt(t, pid, recoverytest.None)
			l := b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 1, 3 })
			counts := b.Settle(t, l)
			op := b.Operation(t, pid)
			if op.Status != workflow.StatusNeedsReconciliation {
				t.Fatalf("status %s", op.Status)
			}
			if counts.BackedOff < 1 {
				t.Errorf("went to a person without backing off first: %+v", counts)
			}
			var lastKind string
			var lastAt, reconciledAt time.Time
			b.DB.Pool.QueryRow(ctx, `SELECT at FROM operation_events WHERE operation_id = $1 AND branch = 'reconciliation'`, op.ID).Scan(&reconciledAt)
			b.DB.Pool.QueryRow(ctx, `
				SELECT kind, at FROM operation_calls WHERE operation_id = $1 AND kind IN ('call', 'status') ORDER BY id DESC LIMIT 1`,
				op.ID).Scan(&lastKind, &lastAt)
			if lastKind != "status" || lastAt.After(reconciledAt) {
				t.Fatalf("the last exchange before the hand-over was a %s at %s (hand-over at %s)", lastKind, lastAt, reconciledAt)
			}
			if n := b.Effects(t, pid); n != 0 {
				t.Fatalf("effects %d", n)
			}
		})
	}
}

// Every payments mode × every crash point around the refund (the provider
// healthy): after recovery with the faults off, the operation is in its
// documented state with at most one refund — exactly one where the policy
// is cancelled and the refund was not refused. A refused refund waits for a
// person: the policy stays cancelled, nothing is paid twice.
func TestEveryPaymentsModeAndRefundCrashPointEndsInItsDocumentedState(t *testing.T) {
	t.Parallel()
	type want struct {
		status  string
		refunds int
		branch  string // the branch recovery took; "" = nothing to recover
	}
	var (
		succeeded   = want{workflow.StatusSucceeded, 1, ""}
		refused     = want{workflow.StatusNeedsReconciliation, 0, ""}
		afterRetry  = want{workflow.StatusSucceeded, 1, workflow.BranchNotStarted}
		afterAsking = want{workflow.StatusSucceeded, 1, workflow.BranchCompleted}
		refusedSeen = want{workflow.StatusNeedsReconciliation, 0, workflow.BranchRejected}
	)
	atTheEnd := map[fault.Mode]want{
		fault.ModeOK: succeeded, fault.ModeReject: refused, fault.ModeError: afterRetry, fault.ModeDrop: afterRetry,
		fault.ModeLostResponse: afterAsking, fault.ModeSlow: afterAsking,
	}
	afterTheCall := map[fault.Mode]want{
		fault.ModeOK: afterAsking, fault.ModeReject: refusedSeen, fault.ModeError: afterRetry, fault.ModeDrop: afterRetry,
		fault.ModeLostResponse: afterAsking, fault.ModeSlow: afterAsking,
	}
	expect := func(mode fault.Mode, point crash.Point) want {
		switch point {
		case "before_refund":
			return afterRetry // never sent, whatever the mode would have done
		case "after_refund":
			return afterTheCall[mode]
		case "after_audit":
			if mode == fault.ModeOK { // reached only once payments confirmed; the transaction rolled back
				return afterAsking
			}
		}
		return atTheEnd[mode] // recoverytest.None, after_commit, and a point a mode never reaches
	}
	for _, mode := range []fault.Mode{fault.ModeOK, fault.ModeReject, fault.ModeError, fault.ModeDrop, fault.ModeLostResponse, fault.ModeSlow} {
		for _, point := range []crash.Point{recoverytest.None, "before_refund", "after_refund", "after_audit", "after_commit"} {
			t.Run(fmt.Sprintf("%s/%s", mode, point), func(t *testing.T) {
				t.Parallel()
				b := recoverytest.Setup(t)
				ctx := context.Background()
				pid := b.PolicyIDs[0]
				// The request waits 300 ms for payments: modes that never answer
				// cost one short timeout. The provider always answers.
				b.PatientRequests(t, recoverytest.ProviderTimeout)
				pf := fault.Default()
				pf.Mode, pf.SlowMS = mode, 800
				if _, err := b.Payments.SetFaults(ctx, pf); err != nil {
					t.Fatal(err)
				}
				before, err := b.CancelCrashingAt(t, pid, point)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.Payments.SetFaults(ctx, fault.Default()); err != nil { // faults off
					t.Fatal(err)
				}
				w := expect(mode, point)
				l := b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls = 6 })
				first, err := l.RunOnce(ctx)
				if err != nil || (before.LeaseExpiresAt.After(time.Now().Add(time.Second)) && first.Claimed != 0) {
					t.Fatalf("first pass claimed %+v (%v) an operation whose lease was running", first, err)
				}
				l.Engine.Clock().Set(time.Now().Add(31 * time.Second))
				counts := recoverytest.Add(first, b.Settle(t, l))

				op := b.Operation(t, pid)
				if op.Status != w.status {
					t.Errorf("status %s, want %s (last error %v)", op.Status, w.status, recoverytest.Deref(op.LastError))
				}
				if got := b.Refunds(t, pid); got != w.refunds {
					t.Errorf("refunds %d, want %d", got, w.refunds)
				}
				if b.Effects(t, pid) != 1 || b.PolicyStatus(t, pid) != policies.StatusCancelled {
					t.Errorf("provider effects %d, policy %s: the cancellation itself must stand", b.Effects(t, pid), b.PolicyStatus(t, pid))
				}
				branches := b.Branches(t, op.ID)
				if w.branch == "" && counts.Claimed != 0 {
					t.Errorf("recovery claimed a finished operation: %+v, branches %v", counts, branches)
				}
				if w.branch != "" && !slices.Contains(branches, w.branch) {
					t.Errorf("branches %v; want %s", branches, w.branch)
				}
				recoverytest.CheckInvariants(t, b.DB)
			})
		}
	}
}

// Recovery keeps its attempt budget when every status query is conclusive
// too (reader's finding 2): a provider that drops every call answers
// NOT_STARTED once the deadlines pass, and recovery sent the call again
// without end — "attempt 6 of 5", "attempt 10 of 5". Out of attempts, a
// NOT_STARTED hands the operation to a person like any other truth that
// cannot finish it; a re-ask while it waits costs no attempt, and sends the
// call once (it never took effect), so the person keeps it while the
// system drops every call: one send per question, at the ladder's top.
func TestAProviderThatDropsEveryCallReachesAPersonAtTheLimit(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeDrop, Idempotent: true})
	b.CancelCrashingAt(t, pid, recoverytest.None) // the request's own attempt, handed over
	const limit = 3
	// Every call is dropped and none is ever answered, so the loop's
	// patience only sets how long each pass waits for nothing: the requests'
	// 300 ms, not the 2 s the loops keep for calls that are answered late.
	b.Timeout = recoverytest.ProviderTimeout
	l := b.Loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.Backoff, c.MaxBackoff, c.ReaskInterval = 1, limit, time.Minute, time.Minute, time.Minute
	})
	sends := func() (n int) {
		t.Helper()
		if err := b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_calls c JOIN operations o ON o.id = c.operation_id WHERE o.policy_id = $1 AND c.kind = 'call'`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	at := time.Now()
	atPerson, passes := -1, 0
	for pass := 0; pass < 20; pass++ {
		at = at.Add(10 * time.Minute) // past every backoff, every deadline and every re-ask
		l.Engine.Clock().Set(at)
		if _, err := l.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		op := b.Operation(t, pid)
		if op.Attempts > limit {
			t.Fatalf("pass %d: %s after %d attempts of %d", pass, op.Status, op.Attempts, limit)
		}
		if atPerson < 0 && op.Status == workflow.StatusNeedsReconciliation {
			atPerson = sends()
			if atPerson > limit+1 { // the request's own send, then the budget's
				t.Fatalf("%d calls sent before a person, within a budget of %d attempts", atPerson, limit)
			}
		} else if atPerson >= 0 {
			passes++
			if op.Status != workflow.StatusNeedsReconciliation {
				t.Fatalf("pass %d: %s; a re-ask's unanswered send must leave it with the person", pass, op.Status)
			}
		}
	}
	op := b.Operation(t, pid)
	if op.Status != workflow.StatusNeedsReconciliation || op.Attempts != limit {
		t.Fatalf("after 20 passes: %s, %d attempts; want NEEDS_RECONCILIATION after %d", op.Status, op.Attempts, limit)
	}
	if passes == 0 {
		t.Fatal("never asked again while waiting for a person")
	}
	if got := sends() - atPerson; got < 1 || got > passes {
		t.Errorf("%d calls sent in %d re-asks while waiting for a person; want one per question, at least one", got, passes)
	}
}

// Once the system answers again, an operation that went to a person out of
// attempts with NOT_STARTED needs no person: the re-ask's one send (same
// key, safe because the call never took effect) finishes it (chaos run,
// seed 3: four refunds waited for a person after the faults were healed).
func TestANotStartedOutOfAttemptsIsFinishedOnceTheSystemAnswers(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	pid := b.PolicyIDs[0]
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeDrop, Idempotent: true})
	b.CancelCrashingAt(t, pid, recoverytest.None)
	const limit = 2
	l := b.Loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.Backoff, c.MaxBackoff, c.ReaskInterval = 1, limit, time.Minute, time.Minute, time.Minute
	})
	at := time.Now()
	pass := func() workflow.Operation {
		t.Helper()
		at = at.Add(10 * time.Minute)
		l.Engine.Clock().Set(at)
		if _, err := l.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return b.Operation(t, pid)
	}
	for n := 0; ; n++ {
		if op := pass(); op.Status == workflow.StatusNeedsReconciliation {
			break
		}
		if n == 10 {
			t.Fatal("never reached a person while every call was dropped")
		}
	}
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true}) // the provider is back
	op := pass()
	if op.Status != workflow.StatusSucceeded {
		t.Fatalf("after the provider came back and one re-ask: %s (%v); want SUCCEEDED without a person", op.Status, op.LastError)
	}
	if op.Attempts != limit {
		t.Errorf("attempts %d, want %d: a re-ask's send is not an attempt of the budget", op.Attempts, limit)
	}
	if n := b.Effects(t, pid); n != 1 {
		t.Errorf("%d provider effects, want exactly 1", n)
	}
}
