package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// This file is how a person's decision about an operation recovery could
// not finish (NEEDS_RECONCILIATION) is written. A decision is about the step
// the operation is stuck at. Nobody owns an operation waiting for a person,
// so a decision is conditional on the state the person saw (status and
// updated_at): two admins deciding at once cannot both win, nobody decides
// on a state they never saw, and an operation recovery took back meanwhile
// (its truth became known) is not decided over. The decision then makes the
// person the owner for one transaction and writes through the same fenced
// code path as requests and recovery. The desk that shows the evidence and
// advises is internal/reconciliation.

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

var (
	// ErrStateChanged: the operation is no longer in the state the person
	// saw — usually someone else already resolved it, or recovery learned
	// the truth and finished it.
	ErrStateChanged = errors.New("workflow: the operation changed since it was shown: someone else already resolved it")
	// ErrResolutionNotAllowed: the decision does not fit the step.
	ErrResolutionNotAllowed = errors.New("workflow: that decision does not fit this step")
)

// Decision is one person's decision on one operation, with the state they
// saw when they made it.
type Decision struct {
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
       finished_at = clock_timestamp(), -- the steps' clock (run.go, sqlInsertSteps)
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND s.name = $4
   AND s.state <> 'DONE' -- a done step stays done
RETURNING ` + stepColumns

// sqlCancelSetAside clears a cancel request a person overrode (cancel.go);
// the audit trail keeps both.
const sqlCancelSetAside = `
UPDATE operations
   SET cancel_requested_at = NULL,
       cancel_requested_by = NULL
 WHERE id = $1
   AND owner_token = $2 -- the person owns it for this transaction`

// sqlRetryRequested hands the operation back to recovery with a fresh budget.
const sqlRetryRequested = `
UPDATE operations
   SET status = 'IN_PROGRESS',
       lease_expires_at = now(), -- expired at once: the recovery loop claims it at its next pass
       released = 'retry_requested',
       attempts = 0, -- a fresh budget: a person decided to try again
       updated_at = now()` + opFence

// Decide applies d in tx. It locks the operation as the person saw it,
// checks that the decision fits the step it is stuck at, and then asks
// check — the caller's last word, seeing the operation as locked — which
// may refuse (ErrResolutionNotAllowed) and returns what every timeline line
// of the decision ends with (who decided, seeing what). Refusals, nothing
// written: ErrStateChanged (not as they saw it), ErrNotFound,
// ErrResolutionNotAllowed.
func (e *Engine) Decide(ctx context.Context, tx pgx.Tx, d Decision, check func(seen Operation) (note string, err error)) (Operation, error) {
	// Lock the operation as the person saw it, so the steps read next are
	// the ones the decision applies to.
	var locked bool
	err := tx.QueryRow(ctx, `
		SELECT true
		  FROM operations
		 WHERE id = $1
		   AND status = 'NEEDS_RECONCILIATION'
		   AND updated_at = $2 -- else it changed since it was shown
		   FOR UPDATE`, d.OperationID, d.SeenUpdatedAt).Scan(&locked)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, fmt.Errorf("workflow: decide: %w", err)
	}
	seen, err := e.operation(ctx, tx, d.OperationID)
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
	if seen.Status != StatusNeedsReconciliation || !seen.UpdatedAt.Equal(d.SeenUpdatedAt) {
		return Operation{}, ErrStateChanged
	}
	i := seen.current()
	if i == len(seen.Steps) {
		return Operation{}, fmt.Errorf("%w: every step is done", ErrResolutionNotAllowed)
	}
	stuck := seen.Steps[i]
	step, _ := def.step(stuck.Name)
	switch {
	case d.Resolution == ResolveFailed && step.Refused != FailOperation:
		return Operation{}, fmt.Errorf("%w: %s cannot be marked failed — what the earlier steps did elsewhere stands; "+
			"mark it done once it is done by hand, or retry", ErrResolutionNotAllowed, stuck.Name)
	case d.Resolution != ResolveRetry && !stuck.External() && seen.CancelRequestedAt != nil:
		// A local step is the workflow's own write: marking it done would
		// skip what it writes. Only recovery runs it (a cancelled
		// operation handed to a person stops at one: cancel.go).
		return Operation{}, fmt.Errorf("%w: %s is a step of this database's own: retry runs it", ErrResolutionNotAllowed, stuck.Name)
	case d.Resolution == ResolveRetry && stuck.State == StepFailed:
		return Operation{}, fmt.Errorf("%w: %s was refused definitely; the same call would be refused again", ErrResolutionNotAllowed, stuck.Name)
	}
	note, err := check(seen)
	if err != nil {
		return Operation{}, err
	}

	r := e.runner(def, seen, d.Actor)
	r.branch = BranchResolved
	took, err := scanOperation(tx.QueryRow(ctx, sqlDecide, seen.ID, d.SeenUpdatedAt, d.Actor))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrStateChanged
	}
	if err != nil {
		return Operation{}, fmt.Errorf("workflow: decide: %w", err)
	}
	took.Steps = seen.Steps
	r.op, r.token = took, *took.OwnerToken
	decided, _ := json.Marshal(map[string]string{"decided_by": d.Actor, "decision": string(d.Resolution), "note": d.Note})

	decide := func() error {
		switch d.Resolution {
		case ResolveDone:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person confirmed that "+stuck.Name+" happened: marked done"+note, "workflow.sqlDecide"); err != nil {
				return err
			}
			if err := r.writeStep(ctx, tx, i, sqlStepDecided, StepDone, decided); err != nil {
				return err
			}
			next, err := r.advance(ctx, tx, false)
			if err != nil || next == nil {
				return err
			}
			return r.transition(ctx, tx, sqlRetryRequested, "workflow.sqlRetryRequested", "the rest is recovery's: "+r.record(next.index).Name+" is next")
		case ResolveRetry:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person asked for a retry: handed back to recovery, which asks "+database.Deref(stuck.System)+" first"+note, "workflow.sqlDecide"); err != nil {
				return err
			}
			if seen.CancelRequestedAt != nil && (!stuck.External() || def.effectStands(seen, i)) {
				// Cancelled after an effect nothing undoes: the person decided
				// the workflow runs on, so the cancel request is set aside —
				// at a local step, and at an external one (its truth may be
				// NOT_STARTED) when an earlier effect stands with no
				// compensation: kept, the cancel would only stop it there and
				// hand it back to a person, again and again.
				if _, err := tx.Exec(ctx, sqlCancelSetAside, r.op.ID, r.token); err != nil {
					return fmt.Errorf("workflow: set the cancel aside: %w", err)
				}
				if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
					"the cancel requested by "+database.Deref(seen.CancelRequestedBy)+" is set aside by a person: the workflow runs on", "workflow.sqlCancelSetAside"); err != nil {
					return err
				}
			}
			return r.transition(ctx, tx, sqlRetryRequested, "workflow.sqlRetryRequested", "handed back to recovery")
		default:
			if err := r.event(ctx, tx, StatusNeedsReconciliation, stuck.Name,
				"a person marked "+stuck.Name+" failed: it did not happen and will not"+note, "workflow.sqlDecide"); err != nil {
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

// effectStands reports whether an external step before step i of op took
// effect elsewhere while def has no Compensation: a cancel of op can never
// end it cleanly (cancelAt's third case).
func (def *Definition) effectStands(op Operation, i int) bool {
	if len(def.Compensation) > 0 {
		return false
	}
	for _, s := range op.Steps[:i] {
		if s.External() && s.State == StepDone && s.SentAt != nil {
			return true
		}
	}
	return false
}
