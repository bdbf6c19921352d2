package operations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/workflow"
)

// RetryRequest is an admin's request to retry a stopped operation from one
// of its steps (workflow/retry.go has the rule).
type RetryRequest struct {
	OperationID   int64
	Step          string
	SeenUpdatedAt time.Time // the operation's updated_at as the admin saw it
	RequestKey    string    // the request's Idempotency-Key: the new run answers it
	Actor         string    // "admin (request … on app-1)", on the timeline
	DecidedBy     string    // the person, in the audit trail
	Note          string    // why, in their words (optional)
}

// RetryFrom starts the operation again from req.Step as its next run,
// through the engine like any start: tx 1 claims the request's key, checks
// the rule under the operation's lock, lays out the new run (the steps
// before req.Step carried over, done; req.Step and the rest under new keys)
// and writes the retry's line in the audit trail the desk's decisions are
// written to (reconciliation_decisions, 'retry_from'); the run goes on as
// the request's, or recovery's once an outcome is unknown. Refusals,
// committed with the key's answer: workflow.ErrNotFound,
// workflow.ErrStateChanged, *workflow.RetryRefusal. The same key come back
// gets the operation as it is.
func RetryFrom(ctx context.Context, engine *workflow.Engine, req RetryRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	// The type never changes, so it is read before the transaction: it
	// names the definition the engine runs.
	op, err := engine.GetOperation(ctx, req.OperationID, 0, true)
	if err != nil {
		return workflow.Operation{}, err
	}
	return engine.Start(ctx, op.Type, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		seen, op, existing, err := engine.RetryFrom(ctx, tx, workflow.RetryFromRequest{
			OperationID: req.OperationID, Step: req.Step, SeenUpdatedAt: req.SeenUpdatedAt,
			RequestKey: req.RequestKey, Actor: req.Actor,
		}, owner)
		switch {
		case IsRetryRefusal(err):
			return workflow.Operation{}, false, workflow.Refused(err)
		case err != nil || existing:
			return op, existing, err
		}
		return op, false, recordRetry(ctx, tx, req, seen)
	}, hooks)
}

// IsRetryRefusal reports whether err refused a retry from a step (nothing
// written).
func IsRetryRefusal(err error) bool {
	var refusal *workflow.RetryRefusal
	return errors.As(err, &refusal) || errors.Is(err, workflow.ErrNotFound) || errors.Is(err, workflow.ErrStateChanged)
}

// recordRetry writes the retry's line of the audit trail: the step retried
// (its key in the run that stopped), the truth known of it, and the state
// the admin acted on.
func recordRetry(ctx context.Context, tx pgx.Tx, req RetryRequest, seen workflow.Operation) error {
	step, _ := seen.Step(req.Step)
	truth := "UNKNOWN"
	if step.Truth != nil {
		truth = *step.Truth
	}
	by := req.DecidedBy
	if by == "" {
		by = req.Actor
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO reconciliation_decisions (operation_id, step_key, decided_by, actor, decision, seen_updated_at, truth_seen, note)
		VALUES ($1, $2, $3, $4, 'retry_from', $5, $6, $7)`,
		seen.ID, step.Key, by, req.Actor, seen.UpdatedAt, truth, req.Note)
	if err != nil {
		return fmt.Errorf("operations: record the retry: %w", err)
	}
	return nil
}
