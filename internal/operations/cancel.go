package operations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/workflow"
)

// CancelRequest is an admin's request to cancel a live operation.
type CancelRequest struct {
	OperationID int64
	Actor       string // "admin (request … on app-1)", on the timeline
	DecidedBy   string // the person, in the audit trail
	Note        string // why, in their words (optional)
}

// Cancel marks a live operation cancelled, in one transaction with the
// request's key (hooks) and its line in the audit trail the desk's
// decisions are written to (reconciliation_decisions, decision 'cancel'):
// the owner stops before its next step; a step already sent has its truth
// learned first, then the workflow compensates or a person decides
// (workflow/cancel.go). It answers at once with the operation as marked —
// the outcome comes later (Prefer: wait, or GET the operation). Refusals,
// committed with the key's answer: workflow.ErrNotFound,
// *workflow.NotLiveError, workflow.ErrCancelRequested.
func Cancel(ctx context.Context, engine *workflow.Engine, pool txBeginner, req CancelRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	var op workflow.Operation
	var refusal error
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		refusal = nil
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		seen, marked, err := engine.RequestCancel(ctx, tx, req.OperationID, req.Actor)
		if workflow.IsCancelRefusal(err) {
			refusal = workflow.Refused(err)
			return hooks.RunFinish(ctx, tx, workflow.Operation{}, refusal)
		}
		if err != nil {
			return err
		}
		if err := recordCancel(ctx, tx, req, seen); err != nil {
			return err
		}
		op = marked
		return hooks.RunFinish(ctx, tx, op, nil)
	})
	switch {
	case err != nil:
		return workflow.Operation{}, err
	case refusal != nil:
		return workflow.Operation{}, refusal
	}
	return op, nil
}

// txBeginner is what Cancel needs of the pool.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// recordCancel writes the cancel's line of the audit trail: the step the
// operation was at and the truth known of it, the state the admin acted on.
func recordCancel(ctx context.Context, tx pgx.Tx, req CancelRequest, seen workflow.Operation) error {
	stuck, ok := seen.Stuck()
	if !ok {
		return fmt.Errorf("operations: cancel %d: every step is done", seen.ID)
	}
	truth := "UNKNOWN"
	if stuck.Truth != nil {
		truth = *stuck.Truth
	}
	by := req.DecidedBy
	if by == "" {
		by = req.Actor
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO reconciliation_decisions (operation_id, step_key, decided_by, actor, decision, seen_updated_at, truth_seen, note)
		VALUES ($1, $2, $3, $4, 'cancel', $5, $6, $7)`,
		seen.ID, stuck.Key, by, req.Actor, seen.UpdatedAt, truth, req.Note)
	if err != nil {
		return fmt.Errorf("operations: record the cancel: %w", err)
	}
	return nil
}
