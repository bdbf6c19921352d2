package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is what a person does with an operation recovery could not
// finish (NEEDS_RECONCILIATION). A decision is about the step the operation
// is stuck at. Nobody owns an operation waiting for a person, so a decision
// is conditional on the state the person saw (status and updated_at): two
// admins deciding at once cannot both win, nobody decides on a state they
// never saw, and an operation recovery took back meanwhile (its truth
// became known) is not decided over. The decision then makes the person the
// owner for one transaction and writes through the same fenced code path as
// requests and recovery.

// Resolution is a person's decision about the step an operation is stuck at.
type Resolution string

const (
	// ResolveDone: the person checked with the system that the step's
	// effect happened (the provider did cancel; the refund was paid by
	// hand). The step is DONE and the workflow runs on: its local steps in
	// the same commit, any later external step by recovery.
	ResolveDone Resolution = "mark_done"
	// ResolveRetry: hand the operation back to recovery now, with a fresh
	// budget. Recovery asks the system first, as always, so this never
	// sends a blind second call.
	ResolveRetry Resolution = "retry"
	// ResolveFailed: the step's effect did not happen and will not; the
	// operation is FAILED. Only where nothing done elsewhere stands (the
	// step's refusal would fail the operation too).
	ResolveFailed Resolution = "mark_failed"
)

// ParseResolution reads a decision's action. "mark_cancelled" is the
// cancellation's older name for mark_done and means the same.
func ParseResolution(action string) (Resolution, bool) {
	switch action {
	case string(ResolveDone), "mark_cancelled":
		return ResolveDone, true
	case string(ResolveRetry):
		return ResolveRetry, true
	case string(ResolveFailed):
		return ResolveFailed, true
	}
	return "", false
}

var (
	// ErrStateChanged: the operation is no longer in the state the person
	// saw — usually someone else already resolved it, or recovery learned
	// the truth and finished it.
	ErrStateChanged = errors.New("workflow: the operation changed since it was shown: someone else already resolved it")
	// ErrResolutionNotAllowed: the decision does not fit the step.
	ErrResolutionNotAllowed = errors.New("workflow: that decision does not fit this step")
)

// ResolveRequest is one person's decision on one operation, with the state
// they saw when they made it.
type ResolveRequest struct {
	OperationID   int64
	Resolution    Resolution
	SeenUpdatedAt time.Time // the operation's updated_at as shown
	Actor         string    // "admin (request … on app-1)"
	Note          string    // why, in their words (optional)
}

const sqlDecide = `
UPDATE operations
   SET status = 'RECOVERING',
       owner_token = gen_random_uuid(), -- the person owns it for this one transaction
       owner_id = $3,
       lease_expires_at = now() + interval '1 minute',
       released = NULL,
       next_attempt_at = NULL,
       updated_at = now()
 WHERE id = $1
   AND status = 'NEEDS_RECONCILIATION'
   AND updated_at = $2 -- 0 rows: it changed since it was shown (someone else resolved it)
RETURNING ` + opColumns

// sqlStepDecided records a person's word on a step, whatever it was.
const sqlStepDecided = ownerCTE + `
UPDATE operation_steps s
   SET state = $5,
       answer = $6,
       finished_at = now(),
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND s.name = $4
   AND s.state <> 'DONE' -- a done step stays done
RETURNING ` + stepColumns

// sqlRetryRequested hands the operation back to recovery with a fresh budget.
const sqlRetryRequested = `
UPDATE operations
   SET status = 'IN_PROGRESS',
       lease_expires_at = now(), -- expired at once: the recovery loop claims it at its next pass
       released = 'retry_requested',
       attempts = 0, -- a fresh budget: a person decided to try again
       updated_at = now()` + opFence

// Resolve applies a person's decision in one transaction: hooks.Begin, the
// decision and its timeline events, hooks.Finish with the operation. A
// refusal — ErrStateChanged (not as they saw it), ErrNotFound,
// ErrResolutionNotAllowed — goes to hooks.Finish in the same transaction,
// commits with Begin, and is returned wrapped in Refused.
func (e *Engine) Resolve(ctx context.Context, req ResolveRequest, hooks Hooks[Operation]) (Operation, error) {
	var op Operation
	var refusal error
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		refusal = nil
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		var err error
		op, err = e.resolve(ctx, tx, req)
		if errors.Is(err, ErrStateChanged) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrResolutionNotAllowed) {
			refusal = Refused(err)
			return hooks.RunFinish(ctx, tx, Operation{}, refusal)
		}
		if err != nil {
			return err
		}
		return hooks.RunFinish(ctx, tx, op, nil)
	})
	switch {
	case err != nil:
		return Operation{}, err
	case refusal != nil:
		return Operation{}, refusal
	}
	return op, nil
}

func (e *Engine) resolve(ctx context.Context, tx pgx.Tx, req ResolveRequest) (Operation, error) {
	// Lock the operation as the person saw it, so the steps read next are
	// the ones the decision applies to.
	var locked bool
	err := tx.QueryRow(ctx, `
		SELECT true
		  FROM operations
		 WHERE id = $1
		   AND status = 'NEEDS_RECONCILIATION'
		   AND updated_at = $2 -- else it changed since it was shown
		   FOR UPDATE`, req.OperationID, req.SeenUpdatedAt).Scan(&locked)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, fmt.Errorf("workflow: decide: %w", err)
	}
	seen, err := e.operation(ctx, tx, req.OperationID)
	if err != nil {
		return Operation{}, err
	}
	if !locked {
		return Operation{}, ErrStateChanged
	}
	def, ok := e.defs[seen.Type]
	if !ok {
		return Operation{}, fmt.Errorf("workflow: no definition for %q", seen.Type)
	}
	if seen.Status != StatusNeedsReconciliation || !seen.UpdatedAt.Equal(req.SeenUpdatedAt) {
		return Operation{}, ErrStateChanged
	}
	i := seen.current()
	if i == len(seen.Steps) {
		return Operation{}, fmt.Errorf("%w: every step is done", ErrResolutionNotAllowed)
	}
	stuck := seen.Steps[i]
	step, _ := def.step(stuck.Name)
	switch {
	case req.Resolution == ResolveFailed && step.Refused != FailOperation:
		return Operation{}, fmt.Errorf("%w: %s cannot be marked failed — what the earlier steps did elsewhere stands; "+
			"mark it done once it is done by hand, or retry", ErrResolutionNotAllowed, stuck.Name)
	case req.Resolution == ResolveRetry && stuck.State == StepFailed:
		return Operation{}, fmt.Errorf("%w: %s was refused definitely; the same call would be refused again", ErrResolutionNotAllowed, stuck.Name)
	}

	r := e.runner(def, seen, req.Actor)
	r.branch = BranchResolved
	took, err := scanOperation(tx.QueryRow(ctx, sqlDecide, seen.ID, req.SeenUpdatedAt, req.Actor))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrStateChanged
	}
	if err != nil {
		return Operation{}, fmt.Errorf("workflow: decide: %w", err)
	}
	took.Steps = seen.Steps
	r.op, r.token = took, *took.OwnerToken
	note := ""
	if req.Note != "" {
		note = " — " + req.Note
	}
	decided, _ := json.Marshal(map[string]string{"decided_by": req.Actor, "decision": string(req.Resolution), "note": req.Note})

	decide := func() error {
		switch req.Resolution {
		case ResolveDone:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person confirmed that "+stuck.Name+" happened: marked done"+note, sqlDecide); err != nil {
				return err
			}
			if err := r.writeStep(ctx, tx, i, sqlStepDecided, StepDone, decided); err != nil {
				return err
			}
			next, err := r.advance(ctx, tx, false)
			if err != nil || next == nil {
				return err
			}
			return r.transition(ctx, tx, sqlRetryRequested, "the rest is recovery's: "+r.record(next.index).Name+" is next")
		case ResolveRetry:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person asked for a retry: handed back to recovery, which asks "+deref(stuck.System)+" first"+note, sqlDecide); err != nil {
				return err
			}
			return r.transition(ctx, tx, sqlRetryRequested, "handed back to recovery")
		default:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person marked "+stuck.Name+" failed: it did not happen and will not"+note, sqlDecide); err != nil {
				return err
			}
			if err := r.writeStep(ctx, tx, i, sqlStepDecided, StepFailed, decided); err != nil {
				return err
			}
			return r.refuse(ctx, tx, i, "marked failed by a person"+note)
		}
	}
	if err := decide(); err != nil {
		return Operation{}, err
	}
	return r.op, r.flush(ctx, tx)
}
