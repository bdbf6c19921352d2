package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/workflow"
)

// CrashPoint names a moment in the cancellation where a process can die, for
// the crash labs and tests. What is durable at each point, and who finishes
// the work, is the table in docs/cancellation.md.
type CrashPoint = crash.Point

const (
	// CrashAfterClaim: the operation is recorded IN_PROGRESS under a lease;
	// the provider was never called.
	CrashAfterClaim CrashPoint = "after_claim"
	// CrashAfterProviderCall: the provider answered (or timed out); nothing
	// of its answer is recorded.
	CrashAfterProviderCall CrashPoint = "after_provider_call"
	// CrashAfterCommit: the outcome and the request's answer are committed;
	// the client never received the answer.
	CrashAfterCommit CrashPoint = "after_commit"
)

// CrashPoints lists them in the order the workflow passes them.
var CrashPoints = []CrashPoint{CrashAfterClaim, CrashAfterProviderCall, CrashAfterCommit}

// Canceller runs the cancellation workflow of one request:
//
//	tx 1:  hooks.Begin (the request's key claim); record the intent
//	       IN_PROGRESS with this request as owner (lease)
//	       ── no transaction open ──
//	call:  provider.Cancel with the operation's provider key
//	       ── no transaction open ──
//	tx 2:  confirmed → SUCCEEDED + policy CANCELLED · rejected → FAILED ·
//	       unknown → stays IN_PROGRESS, handed to recovery;
//	       and hooks.Finish (the caller's answer) in the same commit
//
// No transaction spans the network call: a slow provider never holds a row
// lock or a connection.
type Canceller struct {
	pool     *pgxpool.Pool
	store    *Store
	provider provider.Client
	lease    time.Duration
	// Crash, when set, is called at each CrashPoint; a lab or test makes it
	// kill the process there.
	Crash func(ctx context.Context, at CrashPoint)
}

// NewCanceller returns a Canceller whose requests own an operation for lease.
func NewCanceller(pool *pgxpool.Pool, p provider.Client, lease time.Duration) *Canceller {
	return &Canceller{pool: pool, store: NewStore(pool), provider: p, lease: lease}
}

// CancelRequest is one request to cancel a policy.
type CancelRequest struct {
	UserID     int64
	PolicyID   int64
	Reason     string
	RequestKey string // the client's Idempotency-Key, kept on the operation
	Actor      string // who is asking, for the timeline: "request <id> on <instance>"
}

// Cancel runs the workflow and returns the operation as committed: SUCCEEDED,
// FAILED (the provider refused), or IN_PROGRESS (outcome unknown; recovery
// finishes it). The hooks tie it to the request (workflow.Hooks):
//
//   - hooks.Begin runs first in transaction 1;
//   - a refusal decided in transaction 1 — ErrNotFound (no such active
//     policy of this user) or a *DuplicateIntentError — goes to
//     hooks.Finish in transaction 1 and commits with it (one commit), and is
//     then returned as the error;
//   - a retry of the request that started the operation (same key, after its
//     process died) is answered in transaction 1 with the operation as it is
//     now: nothing is called again;
//   - otherwise hooks.Finish runs in the transaction that records the
//     provider's outcome.
//
// Any other error rolls its transaction back and is returned: ErrLeaseLost
// (someone took the operation over while the provider was called; the
// outcome is theirs to record) or a database failure.
func (c *Canceller) Cancel(ctx context.Context, req CancelRequest, hooks workflow.Hooks[Operation]) (Operation, error) {
	owner := Owner{ID: req.Actor, Lease: c.lease}
	var op Operation
	var refusal error // a business "no", committed with Finish
	answered := false // a retry of the request that started the operation
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		var err error
		op, err = c.store.StartCancellation(ctx, tx, req.UserID, req.PolicyID, req.RequestKey, req.Reason, owner)
		var dup *DuplicateIntentError
		switch {
		case errors.As(err, &dup) && dup.SameRequest:
			// Its first attempt died before answering: the answer is the
			// operation's state now (finished by recovery, or under way).
			if op, err = c.store.RecordRetry(ctx, tx, dup.OperationID, req.Actor); err != nil {
				return err
			}
			answered = true
			return hooks.RunFinish(ctx, tx, op, nil)
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrDuplicateIntent):
			refusal = err
			return hooks.RunFinish(ctx, tx, Operation{}, err)
		case err != nil:
			return err
		}
		return nil
	})
	switch {
	case err != nil:
		return Operation{}, err
	case answered:
		return op, nil
	case refusal != nil:
		return Operation{}, workflow.Refused(refusal)
	}
	c.crash(ctx, CrashAfterClaim)

	// From here on the work continues even if the client goes away: it
	// will retry with the same key and must find the work done or owned.
	ctx = context.WithoutCancel(ctx)
	res, err := c.provider.Cancel(ctx, provider.CancelRequest{Key: op.ProviderKey, PolicyID: op.PolicyID, Reason: op.Reason})
	if err != nil {
		// Not sent at all (the client refused its arguments): nothing was
		// applied, but recovery is still the one place that decides.
		res = provider.Result{Outcome: provider.Unknown, Err: err}
	}
	c.crash(ctx, CrashAfterProviderCall)

	op, err = c.record(ctx, op.ID, *op.OwnerToken, note{actor: req.Actor}, res, hooks)
	if err != nil {
		return Operation{}, err
	}
	c.crash(ctx, CrashAfterCommit)
	return op, nil
}

// Record writes what a provider call told us, as the owner holding token:
// the one code path by which requests and the recovery loop finish an
// operation. See Cancel for the transitions; hooks.Finish runs in the same
// transaction.
func (c *Canceller) Record(ctx context.Context, opID int64, token, actor string, res provider.Result, hooks workflow.Hooks[Operation]) (Operation, error) {
	return c.record(ctx, opID, token, note{actor: actor}, res, hooks)
}

// record is Record with the recovery loop's branch and wording on the
// timeline (n.detail "" keeps the default wording).
func (c *Canceller) record(ctx context.Context, opID int64, token string, n note, res provider.Result, hooks workflow.Hooks[Operation]) (Operation, error) {
	var op Operation
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		switch res.Outcome {
		case provider.Confirmed:
			op, err = c.store.succeed(ctx, tx, opID, token, n.or("provider confirmed the cancellation"))
		case provider.Rejected:
			why := "provider refused: " + res.Reason
			op, err = c.store.fail(ctx, tx, opID, token, string(provider.TruthRejected), why, n.or(why))
		default:
			op, err = c.store.HandOver(ctx, tx, opID, token, unknownCause(res), n.actor)
		}
		if err != nil {
			return err
		}
		return hooks.RunFinish(ctx, tx, op, nil)
	})
	if err != nil {
		return Operation{}, err
	}
	return op, nil
}

func (c *Canceller) crash(ctx context.Context, at CrashPoint) {
	if c.Crash != nil {
		c.Crash(ctx, at)
	}
}

// unknownCause says in a few words why an outcome is unknown.
func unknownCause(res provider.Result) string {
	switch {
	case res.Truth == provider.TruthRunning:
		return "the provider accepted the request and is still running it"
	case errors.Is(res.Err, context.DeadlineExceeded):
		return "the provider did not answer in time"
	case res.Err != nil:
		return fmt.Sprintf("no usable answer from the provider: %v", res.Err)
	default:
		return "no answer from the provider"
	}
}

// or returns n with detail set to def when n has none.
func (n note) or(def string) note {
	if n.detail == "" {
		n.detail = def
	}
	return n
}
