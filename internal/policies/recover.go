package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Recovery is what the recovery loop needs from this package: it claims
// stale policy operations (claim.go) and recovers cancellations (here).
//
//	loop := recovery.New(rec, cfg)             // rec claims
//	loop.Register(policies.OperationCancel, rec) // rec recovers
type Recovery struct {
	pool      *pgxpool.Pool
	store     *Store
	canceller *Canceller
	provider  provider.Client
	// sleep waits between polls; it reports false when ctx ended first.
	sleep func(ctx context.Context, d time.Duration) bool
}

var _ recovery.Recoverer = (*Recovery)(nil)

// NewRecovery returns the recovery of cancellations made by c. It finishes
// them through c's Record path, the one the requests use.
func NewRecovery(c *Canceller) *Recovery {
	return &Recovery{pool: c.pool, store: c.store, canceller: c, provider: c.provider, sleep: sleepCtx}
}

// The branches of the decision tree, as recorded on the timeline (column
// operation_events.branch) and shown on the recovery page.
const (
	BranchCompleted      = "completed"         // provider says COMPLETED: finish locally
	BranchRejected       = "rejected"          // provider says REJECTED: FAILED
	BranchNotStarted     = "not_started"       // provider never saw the call: retry it, same key
	BranchPoll           = "poll"              // RUNNING or unreachable: wait, renew the lease, ask again
	BranchRetryUnknown   = "retry_unknown"     // still unknown after polling, idempotent provider: retry, same key
	BranchReconciliation = "reconciliation"    // still unknown, not idempotent (or out of attempts): a person decides
	BranchBackoff        = "backoff"           // the attempt learned nothing: try again later
	BranchResolved       = "resolved_by_admin" // a person decided (reconcile.go)
)

// Recover runs the decision tree on one claimed cancellation:
//
//	ask the provider for the truth of the operation's provider key
//	  COMPLETED   → SUCCEEDED (policy CANCELLED), through Canceller.Record
//	  REJECTED    → FAILED
//	  NOT_STARTED → send the same call with the same key; record its answer
//	  RUNNING, or the provider cannot be asked →
//	      poll: renew the lease (fenced), wait (growing), ask again — at most b.MaxPolls times
//	      still not known → idempotent provider: send the same call again
//	                        otherwise: NEEDS_RECONCILIATION, never a blind retry
//	a call whose answer is unknown → back off (attempts+1), or after
//	b.MaxAttempts attempts → NEEDS_RECONCILIATION
//
// Every write is fenced by c.Token. Losing the lease at any step ends the
// attempt with OutcomeFenced and nothing written: the new owner decides.
func (r *Recovery) Recover(ctx context.Context, c recovery.Claim, b recovery.Budget) (recovery.Result, error) {
	op, err := r.store.GetOperation(ctx, c.ID, 0, true)
	if err != nil {
		return recovery.Result{}, err
	}
	a := &attempt{r: r, claim: c, budget: b, op: op}
	res, err := a.decide(ctx)
	if errors.Is(err, ErrLeaseLost) {
		return recovery.Result{Outcome: recovery.OutcomeFenced, Branch: res.Branch, Polls: a.polls}, nil
	}
	res.Polls = a.polls
	return res, err
}

// attempt is one recovery attempt of one operation by one claimer.
type attempt struct {
	r      *Recovery
	claim  recovery.Claim
	budget recovery.Budget
	op     Operation
	polls  int
}

func (a *attempt) decide(ctx context.Context) (recovery.Result, error) {
	truth, askErr := a.ask(ctx)
	for {
		if askErr == nil {
			switch truth {
			case provider.TruthCompleted:
				return a.finish(ctx, BranchCompleted, provider.Result{Outcome: provider.Confirmed, Truth: truth},
					"the provider says COMPLETED: finished locally, no second call")
			case provider.TruthRejected:
				return a.finish(ctx, BranchRejected, provider.Result{Outcome: provider.Rejected, Truth: truth, Reason: "the provider's record says REJECTED"},
					"the provider says REJECTED: nothing was applied")
			case provider.TruthNotStarted:
				// Safe even on a provider that is not idempotent: it has no
				// record of the key, so the call has never been applied.
				return a.retry(ctx, BranchNotStarted, "the provider never saw the call: sent it again with the same key")
			}
		}
		// RUNNING, or the truth cannot be learned right now: poll, bounded.
		if a.polls == a.budget.MaxPolls {
			break
		}
		a.polls++
		wait := a.budget.PollWait(a.polls)
		detail := fmt.Sprintf("poll %d/%d: %s; lease renewed, asking again in %s",
			a.polls, a.budget.MaxPolls, describe(truth, askErr), wait)
		if err := a.write(ctx, func(tx pgx.Tx) error {
			_, err := a.r.store.RenewLease(ctx, tx, a.op.ID, a.claim.Token, a.budget.Lease+wait, string(truth), a.note(BranchPoll, detail))
			return err
		}); err != nil {
			return recovery.Result{Branch: BranchPoll}, err
		}
		if !a.r.sleep(ctx, wait) {
			return recovery.Result{Branch: BranchPoll}, ctx.Err()
		}
		truth, askErr = a.ask(ctx)
	}

	// Polling is over and the outcome is still unknown.
	seen := describe(truth, askErr)
	if !a.budget.RetryUnknown {
		return a.reconcile(ctx, fmt.Sprintf("after %d polls %s, and the provider is not idempotent: "+
			"calling it again could cancel twice, so a person must decide", a.polls, seen), string(truth))
	}
	return a.retry(ctx, BranchRetryUnknown, fmt.Sprintf("after %d polls %s; the provider is idempotent, so the same call was sent again", a.polls, seen))
}

// retry sends the operation's call again, with the same provider key, and
// records what it learned.
func (a *attempt) retry(ctx context.Context, branch, why string) (recovery.Result, error) {
	res, err := a.r.provider.Cancel(ctx, provider.CancelRequest{Key: a.op.ProviderKey, PolicyID: a.op.PolicyID, Reason: a.op.Reason})
	if err != nil {
		res = provider.Result{Outcome: provider.Unknown, Err: err}
	}
	switch res.Outcome {
	case provider.Confirmed:
		return a.finish(ctx, branch, res, why+": the provider confirmed")
	case provider.Rejected:
		return a.finish(ctx, branch, res, why+": the provider refused: "+res.Reason)
	default:
		return a.backOff(ctx, branch, why+": "+unknownCause(res), string(res.Truth))
	}
}

// finish records a definite answer through Canceller.record, the code path
// the requests use.
func (a *attempt) finish(ctx context.Context, branch string, res provider.Result, detail string) (recovery.Result, error) {
	op, err := a.r.canceller.record(ctx, a.op.ID, a.claim.Token, a.note(branch, detail), res, workflow.Hooks[Operation]{})
	if err != nil {
		return recovery.Result{Branch: branch}, err
	}
	outcome := recovery.OutcomeSucceeded
	if op.Status == OpFailed {
		outcome = recovery.OutcomeFailed
	}
	return recovery.Result{Outcome: outcome, Branch: branch}, nil
}

// backOff ends an attempt that learned nothing: the operation is claimable
// again after a growing wait, or goes to reconciliation when this was the
// last attempt allowed.
func (a *attempt) backOff(ctx context.Context, branch, why, truth string) (recovery.Result, error) {
	attempts := a.op.Attempts + 1
	if attempts >= a.budget.MaxAttempts {
		return a.reconcile(ctx, fmt.Sprintf("%s — attempt %d of %d, giving up", why, attempts, a.budget.MaxAttempts), truth)
	}
	wait := a.budget.BackoffAfter(attempts)
	detail := fmt.Sprintf("%s — attempt %d of %d; next attempt in %s", why, attempts, a.budget.MaxAttempts, wait)
	err := a.write(ctx, func(tx pgx.Tx) error {
		_, err := a.r.store.BackOff(ctx, tx, a.op.ID, a.claim.Token, wait, truth, why, a.note(BranchBackoff, detail))
		return err
	})
	if err != nil {
		return recovery.Result{Branch: branch}, err
	}
	return recovery.Result{Outcome: recovery.OutcomeBackedOff, Branch: branch}, nil
}

func (a *attempt) reconcile(ctx context.Context, why, truth string) (recovery.Result, error) {
	err := a.write(ctx, func(tx pgx.Tx) error {
		_, err := a.r.store.SendToReconciliation(ctx, tx, a.op.ID, a.claim.Token, truth, why, a.note(BranchReconciliation, why))
		return err
	})
	if err != nil {
		return recovery.Result{Branch: BranchReconciliation}, err
	}
	return recovery.Result{Outcome: recovery.OutcomeReconcile, Branch: BranchReconciliation}, nil
}

// ask queries the provider's truth for the operation's key. An error means
// the truth cannot be learned right now (provider.ErrUnreachable).
func (a *attempt) ask(ctx context.Context) (provider.Truth, error) {
	return a.r.provider.Status(ctx, a.op.ProviderKey)
}

func (a *attempt) write(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, a.r.pool, f)
}

func (a *attempt) note(branch, detail string) note {
	return note{actor: a.claim.Actor, branch: branch, detail: detail}
}

// describe says in words what the last status query told us.
func describe(truth provider.Truth, err error) string {
	if err != nil {
		return "the provider could not be asked (" + err.Error() + ")"
	}
	return "the provider says " + string(truth)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
