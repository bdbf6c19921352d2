package operations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/workflow"
)

var (
	// ErrNotFailed: only a FAILED operation is resumed; this one is live,
	// waiting for a person, or SUCCEEDED.
	ErrNotFailed = errors.New("operations: only a FAILED operation can be resumed")
	// ErrResumeNotAllowed: the operation's kind may not run again as it
	// was. A failed deposit booking released its slot when its charge was
	// refused: running it again could hold a slot someone else has booked
	// since, so the customer books again instead.
	ErrResumeNotAllowed = errors.New("operations: this kind of operation is not resumed; start a new one")
)

// NotFailedError names the status that made a resume refuse.
type NotFailedError struct{ Status string }

func (e *NotFailedError) Error() string {
	return fmt.Sprintf("%v (it is %s)", ErrNotFailed, e.Status)
}
func (e *NotFailedError) Unwrap() error { return ErrNotFailed }

// Resumable are the operation types a person may resume: the ones whose
// start restarts a FAILED operation itself (workflow.Restart) — a policy
// cancellation and a deposit cancellation, both still ACTIVE or CONFIRMED
// after their failure, so a new run is what a new request would do.
var Resumable = map[string]bool{"CANCEL": true, "CANCEL_DEPOSIT": true}

// ResumeRequest is an admin's request to run a FAILED operation again.
type ResumeRequest struct {
	OperationID int64
	RequestKey  string        // the request's Idempotency-Key: the run answers it
	Actor       string        // "admin (request … on app-1)", on every timeline line
	ClockSkew   time.Duration // the margin on every deadline: when a NOT_STARTED is conclusive
}

// Resume starts the FAILED operation again as its next run, through the
// engine like any start: tx 1 claims the request's key and restarts the
// operation (a new run lays out new step keys, so every call is a new call,
// never a retry of the refused one); the run goes on as the request's, or
// recovery's once an outcome is unknown. Refusals, committed with the
// key's answer: workflow.ErrNotFound, *NotFailedError, ErrResumeNotAllowed.
// The same key come back (after a crash) gets the operation as it is.
func Resume(ctx context.Context, engine *workflow.Engine, req ResumeRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	// The type never changes, so it is read before the transaction: it
	// names the definition the engine runs.
	op, err := engine.GetOperation(ctx, req.OperationID, 0, true)
	if err != nil {
		return workflow.Operation{}, err
	}
	if op.Status == workflow.StatusFailed && op.IdempotencyKey != req.RequestKey {
		if err := askFirst(ctx, engine, op, req.ClockSkew); err != nil {
			return workflow.Operation{}, err
		}
	}
	return engine.Start(ctx, op.Type, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		seen, err := workflow.ScanOperation(tx.QueryRow(ctx, `
			SELECT `+workflow.OperationColumns+`
			  FROM operations
			 WHERE id = $1
			   FOR UPDATE -- one resume at a time; the restart below re-checks FAILED anyway`, req.OperationID))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return workflow.Operation{}, false, workflow.Refused(workflow.ErrNotFound) // purged meanwhile
		case err != nil:
			return workflow.Operation{}, false, fmt.Errorf("operations: resume %d: %w", req.OperationID, err)
		case seen.IdempotencyKey == req.RequestKey:
			return seen, true, nil // this request's own run, come back after a crash
		case !Resumable[seen.Type]:
			return workflow.Operation{}, false, workflow.Refused(ErrResumeNotAllowed)
		case seen.Status != workflow.StatusFailed:
			return workflow.Operation{}, false, workflow.Refused(&NotFailedError{Status: seen.Status})
		}
		restarted, ok, err := workflow.Restart(ctx, tx, seen.ID, req.RequestKey, nil, owner)
		if err != nil {
			return workflow.Operation{}, false, err
		}
		if !ok {
			return workflow.Operation{}, false, workflow.Refused(&NotFailedError{Status: workflow.StatusInProgress})
		}
		return restarted, false, nil
	}, hooks)
}

// askFirst asks the system of every step of op's run whose outcome nobody
// knows — SENT or UNKNOWN: a person marked the operation failed, or a
// cancel stopped it, while the call was out — whether it took effect. A
// resume sends every step again under new keys, so a call that did would
// be made twice (third read: a cancellation a person had marked failed,
// though the provider had applied it, was resumed and cancelled twice). The
// rule is a retry from a step's (retry.go) and recovery's: the truth is
// learned first, never guessed by sending again under another key.
// REJECTED, or NOT_STARTED once the call's deadline and skew have passed,
// let the resume go on; COMPLETED refuses it (ErrRetryStepTookEffect); no
// answer, RUNNING or a NOT_STARTED too early refuse it for now
// (ErrRetryStepUnknown). Either refusal is a *RetryRefusal.
func askFirst(ctx context.Context, engine *workflow.Engine, op workflow.Operation, skew time.Duration) error {
	for _, rec := range op.Steps {
		if !rec.External() || (rec.State != workflow.StepSent && rec.State != workflow.StepUnknown) {
			continue
		}
		st, ok := engine.Step(op.Type, rec.Name)
		if !ok || st.Call == nil {
			return fmt.Errorf("operations: resume %d: no call for step %s", op.ID, rec.Name)
		}
		refuse := func(kind error, why string) error {
			return &RetryRefusal{Kind: kind, Step: rec.Name, State: rec.State, Status: op.Status, Why: why}
		}
		sys := *rec.System
		truth, err := st.Call.Status(ctx, rec.Key)
		switch {
		case err != nil:
			return refuse(ErrRetryStepUnknown, fmt.Sprintf("nobody knows whether %s took effect, and %s could not be asked just now: a resume would send it again under a new key, so it waits until %s answers", rec.Name, sys, sys))
		case truth == external.TruthCompleted:
			return refuse(ErrRetryStepTookEffect, fmt.Sprintf("%s says %s (%s) took effect, although this run was stopped as failed: a resume would do it again under a new key", sys, rec.Name, rec.Key))
		case truth == external.TruthRejected:
			continue
		case truth == external.TruthNotStarted && (rec.DeadlineAt == nil || time.Now().After(rec.DeadlineAt.Add(skew))):
			continue
		default:
			return refuse(ErrRetryStepUnknown, fmt.Sprintf("%s says %s for %s, and its call may still arrive: a resume waits until its outcome is known", sys, truth, rec.Name))
		}
	}
	return nil
}
