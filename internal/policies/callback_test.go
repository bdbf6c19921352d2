package policies_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/workflow"
)

// unknownCancellation leaves policy pid's cancellation with its provider
// call's outcome unknown (lost_response: the provider applied it, the
// answer never came), handed to recovery.
func (b *bundle) unknownCancellation(t *testing.T, pid int64) workflow.Operation {
	t.Helper()
	op, err := b.cancel(t, pid, fmt.Sprint("race-", pid))
	if err != nil || op.Status != workflow.StatusInProgress || state(op, policies.StepProviderCancel) != workflow.StepUnknown {
		t.Fatalf("setup: %+v %v", op, err)
	}
	for wait := time.Now().Add(10 * time.Second); b.effects(t, pid) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(wait) { // the apply commits as the call arrives, long before this
			t.Fatalf("setup: %d provider effects, want 1: the lost_response call did not take effect (late, refused?), so the outcome the callbacks tell is not the truth", b.effects(t, pid))
		}
	}
	return op
}

// lostPatience is how long the callback tests wait for a lost_response
// call, which is applied and never answered: long enough for it to arrive
// before its deadline on a loaded machine. (At 400 ms, stress run 1 of
// 2026-12-05 — a burner on both cores — had it arrive late: the fake
// rightly refused it, no effect existed, and the round's premise with it.)
// Every round pays it once.
const lostPatience = 2 * time.Second

// The race of issue 28: one step whose outcome is unknown, a recovery
// worker asking the provider about it, and N callbacks telling it — copies
// of one COMPLETED event, a second COMPLETED event, and a late RUNNING — all
// released at once. Whichever commits first wins: exactly one of them
// records the outcome; every other changes nothing and is counted (the
// worker's write fenced, a callback stale or a duplicate). One provider
// effect, one refund, the step DONE once.
func TestACallbackAndRecoveryRacingForOneStepEndInOneOutcome(t *testing.T) {
	t.Parallel()
	const n = 16
	b := setupWithTimeout(t, lostPatience)
	b.setMode(t, fake.ModeLostResponse)
	ctx := context.Background()
	budget := recovery.DefaultConfig().Budget()
	budget.ClockSkew = 0
	tally := map[string]int{}
	for round, pid := range b.policyIDs {
		b.setMode(t, fake.ModeLostResponse)
		op := b.unknownCancellation(t, pid)
		b.setMode(t, fake.ModeOK) // the refund that follows is answered
		claims, err := b.engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.SkipLocked, Actor: "recovery",
			Lease: time.Minute, Limit: 1})
		if err != nil || len(claims) != 1 || claims[0].ID != op.ID {
			t.Fatalf("claim: %+v %v", claims, err)
		}
		key := providerKey(op)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		outcomes := map[workflow.CallbackOutcome]int{}
		var rec recovery.Result
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var err error
			if rec, err = b.engine.Recover(ctx, claims[0], budget); err != nil {
				t.Error(err)
			}
		}()
		for i := range n {
			cb := workflow.Callback{System: "provider", EventID: "evt-a", StepKey: key, Truth: external.TruthCompleted, Attempt: i + 1}
			switch {
			case i%4 == 1:
				cb.EventID = "evt-b"
			case i%4 == 3:
				cb.EventID, cb.Truth = "evt-running", external.TruthRunning
			}
			cb.EventID = fmt.Sprint(cb.EventID, "-", pid)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := b.engine.Callback(ctx, cb)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				outcomes[res.Outcome]++
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()

		recoveryWon := rec.Outcome == recovery.OutcomeSucceeded
		if outcomes[workflow.CallbackApplied]+map[bool]int{true: 1}[recoveryWon] != 1 {
			t.Fatalf("round %d: %d callbacks applied, recovery %s: want exactly one winner", round, outcomes[workflow.CallbackApplied], rec.Outcome)
		}
		if !recoveryWon && rec.Outcome != recovery.OutcomeFenced {
			t.Fatalf("round %d: recovery lost the race but ended %s, want fenced", round, rec.Outcome)
		}
		// three events: each received once, every other copy a duplicate
		if got := n - outcomes[workflow.CallbackDuplicate]; got != 3 {
			t.Fatalf("round %d: %d events took effect, want 3 (%v)", round, got, outcomes)
		}
		got, err := b.engine.GetOperation(ctx, op.ID, 0, true)
		if err != nil || got.Status != workflow.StatusSucceeded || state(got, policies.StepProviderCancel) != workflow.StepDone {
			t.Fatalf("round %d: %+v %v", round, got, err)
		}
		var done, refunds int
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE operation_id = $1 AND step = $2 AND detail LIKE $2 || ' DONE%'`,
			op.ID, policies.StepProviderCancel).Scan(&done)
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_payments.refunds WHERE policy_id = $1`, pid).Scan(&refunds)
		if done != 1 || refunds != 1 || b.effects(t, pid) != 1 || b.policyStatus(t, pid) != policies.StatusCancelled {
			t.Fatalf("round %d: step DONE %d times, %d refunds, %d effects, policy %s", round, done, refunds, b.effects(t, pid),
				b.policyStatus(t, pid))
		}
		if recoveryWon {
			tally["recovery won"]++
		} else {
			tally["a callback won"]++
		}
		for o, c := range outcomes {
			tally[string(o)] += c
		}
	}
	t.Logf("%d rounds of %d callbacks vs recovery: %v", len(b.policyIDs), n, tally)
	r, err := invariants.Check(ctx, b.db.Pool, invariants.Options{})
	if err != nil || !r.OK {
		t.Fatalf("invariants: %+v %v", r.Violations, err)
	}
}

// A callback never moves a step backwards: COMPLETED settles it, a late
// RUNNING and a REJECTED that follow change nothing (stale), a copy of the
// COMPLETED is a duplicate, and a key no step has is kept for a person.
func TestCallbacksNeverMoveAStepBackwards(t *testing.T) {
	t.Parallel()
	b := setupWithTimeout(t, lostPatience)
	b.setMode(t, fake.ModeLostResponse)
	ctx := context.Background()
	op := b.unknownCancellation(t, b.policyIDs[0])
	b.setMode(t, fake.ModeOK)
	key := providerKey(op)
	for _, c := range []struct {
		id    string
		key   string
		truth external.Truth
		want  workflow.CallbackOutcome
	}{
		{"e1", key, external.TruthCompleted, workflow.CallbackApplied},
		{"e1", key, external.TruthCompleted, workflow.CallbackDuplicate},
		{"e2", key, external.TruthRunning, workflow.CallbackStale},
		{"e3", key, external.TruthRejected, workflow.CallbackStale},
		{"e4", "999:provider_cancel", external.TruthCompleted, workflow.CallbackUnknownStep},
	} {
		res, err := b.engine.Callback(ctx, workflow.Callback{System: "provider", EventID: c.id, StepKey: c.key, Truth: c.truth, Attempt: 1})
		if err != nil || res.Outcome != c.want {
			t.Fatalf("%s %s: %+v %v, want %s", c.id, c.truth, res, err, c.want)
		}
	}
	got, _ := b.engine.GetOperation(ctx, op.ID, 0, true)
	if got.Status != workflow.StatusSucceeded || state(got, policies.StepProviderCancel) != workflow.StepDone {
		t.Fatalf("%+v", got)
	}
	kept, err := readmodel.Callbacks(ctx, b.db.Pool, readmodel.CallbackFilter{UnknownOnly: true})
	if err != nil || len(kept) != 1 || kept[0].StepKey != "999:provider_cancel" {
		t.Fatalf("kept for a person: %+v %v", kept, err)
	}
	list, _ := readmodel.Callbacks(ctx, b.db.Pool, readmodel.CallbackFilter{OperationID: op.ID})
	if len(list) != 3 || list[len(list)-1].Duplicates != 1 {
		t.Fatalf("the operation's callbacks: %+v", list)
	}
}
