package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// This file is how a live operation is cancelled. Cancelling is one small
// idea in one place:
//
//   - A person's request is a mark on the operation (cancel_requested_at),
//     written only while the operation is live and not yet marked — a
//     conditional write, so of two people cancelling at once one marks it
//     and the other is told it is marked, and a cancel racing the
//     operation's last commit either lands before it (the owner stops) or
//     finds it finished (refused). Nobody's step is interrupted.
//   - The owner sees the mark before its next step: the two writes that
//     begin a step (a local step's DONE, an external step's SENT) are
//     fenced by it as they are by the owner token. A refused write there
//     is not a lost lease: the owner stops at that step (cancelAt, in
//     run.go: stopping is the runner's, between two steps like any other).
//   - A step already SENT is not undone by the mark: nobody knows what it
//     did. Its truth is still learned (its answer, a status query, a
//     callback), never by sending it again. REJECTED: nothing stands, the
//     refusal fails the operation as it always would. COMPLETED: the
//     operation stops before the step after it — and what the earlier
//     external steps did elsewhere is undone by the definition's
//     Compensation, or, when it has none, a person decides.

// ErrNotLive: only an operation someone is running (IN_PROGRESS or
// RECOVERING) can be cancelled. Returned as a *NotLiveError naming its
// status.
var ErrNotLive = errors.New("workflow: only a live operation can be cancelled")

// ErrCancelRequested: someone already asked to cancel the operation.
var ErrCancelRequested = errors.New("workflow: a cancel of this operation was already requested")

// NotLiveError names the status that made a cancel refuse.
type NotLiveError struct{ Status string }

func (e *NotLiveError) Error() string {
	what := "it has finished"
	if e.Status == StatusNeedsReconciliation {
		what = "it waits for a person: decide it on the reconciliation desk"
	}
	return fmt.Sprintf("%v (it is %s: %s)", ErrNotLive, e.Status, what)
}
func (e *NotLiveError) Unwrap() error { return ErrNotLive }

const sqlRequestCancel = `
UPDATE operations
   SET cancel_requested_at = clock_timestamp(), -- after the row lock: later than any step an owner wrote before it
       cancel_requested_by = $2,
       updated_at = now()
 WHERE id = $1
   AND status IN ('IN_PROGRESS', 'RECOVERING') -- 0 rows: finished, or waiting for a person
   AND cancel_requested_at IS NULL -- 0 rows: someone asked first
RETURNING ` + OperationColumns

// RequestCancel marks operation id cancelled by actor, in tx, and returns
// it as it was just before (seen: the state the request acted on, with its
// steps) and as marked. The owner stops before its next step. Refusals,
// nothing written: ErrNotFound, *NotLiveError, ErrCancelRequested.
func (e *Engine) RequestCancel(ctx context.Context, tx pgx.Tx, id int64, actor string) (seen, marked Operation, err error) {
	if seen, err = e.operation(ctx, tx, id); err != nil {
		return Operation{}, Operation{}, err
	}
	marked, err = ScanOperation(tx.QueryRow(ctx, sqlRequestCancel, id, actor))
	if errors.Is(err, pgx.ErrNoRows) {
		// Read again: the row as the conditional write found it.
		now, err := e.operation(ctx, tx, id)
		switch {
		case err != nil:
			return Operation{}, Operation{}, err
		case now.CancelRequestedAt != nil:
			return Operation{}, Operation{}, ErrCancelRequested
		default:
			return Operation{}, Operation{}, &NotLiveError{Status: now.Status}
		}
	}
	if err != nil {
		return Operation{}, Operation{}, fmt.Errorf("workflow: cancel operation %d: %w", id, err)
	}
	marked.Steps = seen.Steps
	detail := "a cancel was requested: it stops before its next step"
	if i := seen.current(); i < len(seen.Steps) && (seen.Steps[i].State == StepSent || seen.Steps[i].State == StepUnknown) {
		detail += "; " + seen.Steps[i].Name + " is already sent and is not undone by cancelling — its outcome is learned first"
	}
	return seen, marked, recordEvent(ctx, tx, event{op: marked, from: seen.Status, actor: actor, step: "", detail: detail,
		statement: "workflow.sqlRequestCancel"})
}

// IsCancelRefusal reports whether err is a refusal of RequestCancel
// (nothing written).
func IsCancelRefusal(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotLive) || errors.Is(err, ErrCancelRequested)
}
