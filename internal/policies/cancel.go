package policies

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/workflow"
)

// OperationCancel is the cancellation's operation type.
const OperationCancel = "CANCEL"

// The cancellation's steps, in order (doc.go draws them).
const (
	StepRecordIntent   = "record_intent"
	StepProviderCancel = "provider_cancel"
	StepMarkCancelled  = "mark_cancelled"
	StepPublishEvent   = "publish_event"
	StepRefund         = "refund"
	StepAudit          = "audit"
)

var (
	// ErrDuplicateIntent: this policy already has a cancellation that is not
	// FAILED. Returned as a *DuplicateIntentError naming it.
	ErrDuplicateIntent = errors.New("policies: the policy already has a cancellation")
)

// DuplicateIntentError names the operation that already expresses the intent.
type DuplicateIntentError struct {
	OperationID int64
	Status      string
}

func (e *DuplicateIntentError) Error() string {
	return fmt.Sprintf("policies: the policy already has cancellation %d (%s)", e.OperationID, e.Status)
}

func (e *DuplicateIntentError) Unwrap() error { return ErrDuplicateIntent }

// cancellation is the workflow's definition: which steps, each local (in
// the transaction of its neighbours) or external (a call, under its step
// key, between transactions).
func (c *Canceller) cancellation(p provider.Client, pay payments.Client) workflow.Definition {
	return workflow.Definition{
		Type: OperationCancel,
		Steps: []workflow.Step{
			{Name: StepRecordIntent}, // written by startCancellation
			{Name: StepProviderCancel, Call: providerCancel{p}, Refused: workflow.FailOperation},
			{Name: StepMarkCancelled, Do: markCancelled},
			{Name: StepPublishEvent, Do: c.publishCancelled},
			// A refused refund cannot undo the cancellation: a person decides.
			{Name: StepRefund, Call: paymentsRefund{pay}, Refused: workflow.Reconcile},
			{Name: StepAudit, Do: audit},
		},
		// The names the crash labs used before the cancellation had steps.
		CrashAliases: map[crash.Point]crash.Point{
			"after_claim":         "before_" + StepProviderCancel,
			"after_provider_call": "after_" + StepProviderCancel,
		},
	}
}

// CrashPoints lists where a process running a cancellation can be made to
// die (CRASH_AT, PUT /api/v1/admin/crash), in the order a run passes them,
// then the older names. docs/cancellation.md says what is durable at each.
var CrashPoints = workflow.CrashPoints((&Canceller{}).cancellation(nil, nil))

// Canceller runs cancellations on the workflow engine.
type Canceller struct {
	engine *workflow.Engine
	outbox *events.Writer // writes policy.cancelled
}

// NewCanceller registers the cancellation workflow with engine, calling the
// provider through p and the payments service through pay, and writing
// policy.cancelled through outbox.
func NewCanceller(engine *workflow.Engine, p provider.Client, pay payments.Client, outbox *events.Writer) *Canceller {
	c := &Canceller{engine: engine, outbox: outbox}
	engine.Register(c.cancellation(p, pay))
	return c
}

// CancelRequest is one request to cancel a policy.
type CancelRequest struct {
	UserID     int64
	PolicyID   int64
	Reason     string
	RequestKey string // the client's Idempotency-Key, kept on the operation
	Actor      string // who is asking, for the timeline: "request <id> on <instance>"
}

// Cancel runs the cancellation of one request and returns the operation as
// committed: SUCCEEDED (every step done), FAILED (the provider refused), or
// IN_PROGRESS (an outcome unknown: recovery finishes it). The commits, with
// the hooks (workflow.Hooks), are:
//
//	tx 1:  hooks.Begin (the request's key claim) · record_intent
//	       (IN_PROGRESS, owned by this request under a lease) ·
//	       provider_cancel SENT with its deadline
//	       ── no transaction open: the provider's own commit ──
//	tx 2:  provider_cancel DONE · mark_cancelled · publish_event ·
//	       refund SENT with its deadline
//	       ── no transaction open: the payments service's own commit ──
//	tx 3:  refund DONE · audit · SUCCEEDED · hooks.Finish (the answer,
//	       stored with the outcome)
//
// A refusal decided in tx 1 — ErrNotFound (no such active policy of this
// user) or a *DuplicateIntentError — goes to hooks.Finish in tx 1, commits
// with the claim, and is returned. A retry of the request that started the
// operation (same key, after its process died) is answered in tx 1 with
// the operation as it is now: nothing is called again. Any other error
// rolls its transaction back: workflow.ErrLeaseLost (recovery took the
// operation over meanwhile; the outcome is its to record) or a database
// failure.
func (c *Canceller) Cancel(ctx context.Context, req CancelRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	return c.engine.Start(ctx, OperationCancel, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		return startCancellation(ctx, tx, req, owner)
	}, hooks)
}

var sqlStartCancellation = `
INSERT INTO operations
       (policy_id, operation_type, user_id, idempotency_key, reason, status,
        owner_token, owner_id, lease_expires_at)
SELECT id, 'CANCEL', user_id, $3, $4, 'IN_PROGRESS',
       gen_random_uuid(), $5, now() + make_interval(secs => $6)
  FROM policies
 WHERE id = $1
   AND user_id = $2 -- someone else's policy inserts nothing
   AND status = 'ACTIVE'
    ON CONFLICT (policy_id, operation_type) DO NOTHING -- the intent exists already: 0 rows
RETURNING ` + workflow.OperationColumns

// startCancellation is record_intent: the intent to cancel the policy,
// owned by owner under a lease, in tx. A FAILED earlier cancellation is
// started again (same row, next run). Refusals: ErrNotFound (no such
// active policy of this user) and a *DuplicateIntentError (a cancellation
// that is not FAILED exists). The request that started the existing
// operation, come back with its key, gets it with existing true.
func startCancellation(ctx context.Context, tx pgx.Tx, req CancelRequest, owner workflow.Owner) (workflow.Operation, bool, error) {
	op, err := workflow.ScanOperation(tx.QueryRow(ctx, sqlStartCancellation,
		req.PolicyID, req.UserID, req.RequestKey, req.Reason, owner.ID, owner.Lease.Seconds()))
	if err == nil {
		return op, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return workflow.Operation{}, false, fmt.Errorf("policies: start cancellation: %w", err)
	}

	// Nothing inserted: no such (active) policy of this user, or the intent exists.
	existing, err := workflow.ScanOperation(tx.QueryRow(ctx, `
		SELECT `+workflow.OperationColumns+`
		  FROM operations
		 WHERE policy_id = $1
		   AND operation_type = 'CANCEL'
		   AND user_id = $2`, req.PolicyID, req.UserID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return workflow.Operation{}, false, workflow.Refused(ErrNotFound)
	case err != nil:
		return workflow.Operation{}, false, fmt.Errorf("policies: start cancellation: %w", err)
	case existing.IdempotencyKey == req.RequestKey:
		return existing, true, nil
	case existing.Status != workflow.StatusFailed:
		return workflow.Operation{}, false, workflow.Refused(&DuplicateIntentError{OperationID: existing.ID, Status: existing.Status})
	}
	op, ok, err := workflow.Restart(ctx, tx, existing.ID, req.RequestKey, &req.Reason, owner)
	if err != nil {
		return workflow.Operation{}, false, fmt.Errorf("policies: restart cancellation: %w", err)
	}
	if !ok {
		return workflow.Operation{}, false, workflow.Refused(&DuplicateIntentError{OperationID: existing.ID, Status: workflow.StatusInProgress})
	}
	return op, false, nil
}
