package reconciliation_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/reconciliation"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/recovery/recoverytest"
	"github.com/idemlab/idemlab/internal/workflow"
)

// An admin's decision is conditional on what they saw: of two admins
// resolving the same operation, one wins and the other learns that someone
// else already did.
func TestResolvingIsConditionalOnTheStateSeen(t *testing.T) {
	t.Parallel()
	for _, res := range []reconciliation.Resolution{reconciliation.ResolveDone, reconciliation.ResolveRetry, reconciliation.ResolveFailed} {
		t.Run(string(res), func(t *testing.T) {
			t.Parallel()
			b := recoverytest.Setup(t)
			// The scenario needs the provider's effect: with the 300 ms default
			// a loaded machine delivered the call after its deadline, the fake
			// refused it (rightly), and there was nothing to decide about.
			b.PatientRequests(t, b.Timeout)
			ctx := context.Background()
			pid := b.PolicyIDs[0]
			b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeLostResponse, Idempotent: false})
			b.CancelCrashingAt(t, pid, recoverytest.None)
			if n := b.Effects(t, pid); n != 1 {
				t.Fatalf("the provider applied the cancellation %d times, want 1: lost_response applies it and drops the answer", n)
			}
			b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false, StatusMode: fake.StatusError})
			b.Believe(t, false)
			b.Settle(t, b.Loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 1, 1 }))
			seen := b.Operation(t, pid)
			if seen.Status != workflow.StatusNeedsReconciliation {
				t.Fatalf("not in reconciliation: %s", seen.Status)
			}

			req := reconciliation.ResolveRequest{OperationID: seen.ID, Resolution: res, SeenUpdatedAt: seen.UpdatedAt, Actor: "admin"}
			var wins, lost int
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := reconciliation.New(b.DB.Pool, b.Engine).Resolve(ctx, req, workflow.Hooks[workflow.Operation]{})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						wins++
					case errors.Is(err, workflow.ErrStateChanged):
						lost++
					default:
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if wins != 1 || lost != 1 {
				t.Fatalf("wins %d, lost %d", wins, lost)
			}
			op := b.Operation(t, pid)
			want := map[reconciliation.Resolution]string{
				reconciliation.ResolveDone:   workflow.StatusInProgress, // the policy cancelled; the refund is recovery's
				reconciliation.ResolveRetry:  workflow.StatusInProgress,
				reconciliation.ResolveFailed: workflow.StatusFailed,
			}[res]
			if op.Status != want {
				t.Fatalf("status %s, want %s", op.Status, want)
			}
			if res == reconciliation.ResolveDone {
				if b.Refunds(t, pid) != 0 {
					t.Fatal("the person's decision refunded: that is a call, recovery's to make")
				}
				b.Settle(t, b.Loop(t, "app-1", nil))
				if op = b.Operation(t, pid); op.Status != workflow.StatusSucceeded || b.Refunds(t, pid) != 1 {
					t.Fatalf("after the decision: %s, refunds %d", op.Status, b.Refunds(t, pid))
				}
			}
			if res == reconciliation.ResolveRetry {
				// Back in recovery's hands, which asks first: with the status
				// query healthy again it learns COMPLETED and finishes.
				b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: false})
				b.Settle(t, b.Loop(t, "app-1", nil))
				if op = b.Operation(t, pid); op.Status != workflow.StatusSucceeded {
					t.Fatalf("after retry: %s", op.Status)
				}
			}
			if b.Effects(t, pid) != 1 {
				t.Fatalf("effects %d", b.Effects(t, pid))
			}
			if got := b.Branches(t, op.ID); !slices.Contains(got, workflow.BranchResolved) {
				t.Fatalf("branches %v", got)
			}
		})
	}
}

// Every action the decisions list can hold reads in words (fourth read: a
// retry from a step showed its code name "retry_from").
func TestEveryDecisionReadsInWords(t *testing.T) {
	for _, action := range []string{"mark_done", "retry", "mark_failed", "retry_from"} {
		if w := reconciliation.DecisionWords(action); w == action || strings.Contains(w, "_") {
			t.Errorf("DecisionWords(%q) = %q: a code name, not words", action, w)
		}
	}
}
