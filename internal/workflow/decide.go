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

// This file is the engine's half of a person's decision about an operation
// recovery could not finish (NEEDS_RECONCILIATION): how it is written.
// Nobody owns an operation waiting for a person, so a decision is
// conditional on the state the person saw (status and updated_at): two
// admins deciding at once cannot both win, nobody decides on a state they
// never saw, and an operation recovery took back meanwhile (its truth
// became known) is not decided over. The person then becomes the owner
// for the decision's one transaction and writes through the same fenced
// code path as requests and recovery. Which decision fits the step and the
// evidence, and what each means, is the desk's (internal/reconciliation).

// ErrStateChanged: the operation is no longer in the state the person
// saw — usually someone else already resolved it, or recovery learned the
// truth and finished it.
var ErrStateChanged = errors.New("workflow: the operation changed since it was shown: someone else already resolved it")

// Person is one person deciding one operation waiting for them, inside
// Engine.Decide: what they saw, and the fenced writes a decision is made
// of. The first write makes them the owner (sqlDecide); until then
// nothing is written, so a decision refused by its checks leaves nothing.
type Person struct {
	ctx   context.Context
	tx    pgx.Tx
	e     *Engine
	def   *Definition
	seen  Operation
	at    time.Time // the updated_at the person saw
	actor string
	r     *runner // nil until the first write
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
RETURNING ` + OperationColumns

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

// Decide runs decide, a person's decision on operation id as they saw it
// (NEEDS_RECONCILIATION, updated at seenUpdatedAt), in tx. It locks the
// operation as seen, so the steps decide reads are the ones the decision
// applies to; decide either refuses — returns before any write, and
// nothing is written — or writes through the Person. It returns the
// operation as decided. Refusals, nothing written: ErrStateChanged (not as
// they saw it), ErrNotFound, and decide's own.
func (e *Engine) Decide(ctx context.Context, tx pgx.Tx, id int64, seenUpdatedAt time.Time, actor string, decide func(p *Person) error) (Operation, error) {
	var locked bool
	err := tx.QueryRow(ctx, `
		SELECT true
		  FROM operations
		 WHERE id = $1
		   AND status = 'NEEDS_RECONCILIATION'
		   AND updated_at = $2 -- else it changed since it was shown
		   FOR UPDATE`, id, seenUpdatedAt).Scan(&locked)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, fmt.Errorf("workflow: decide: %w", err)
	}
	seen, err := e.operation(ctx, tx, id)
	if err != nil {
		return Operation{}, err
	}
	if !locked || seen.Status != StatusNeedsReconciliation || !seen.UpdatedAt.Equal(seenUpdatedAt) {
		return Operation{}, ErrStateChanged
	}
	def, ok := e.defs[seen.Type]
	if !ok {
		return Operation{}, fmt.Errorf("workflow: no definition for %q", seen.Type)
	}
	p := &Person{ctx: ctx, tx: tx, e: e, def: def, seen: seen, at: seenUpdatedAt, actor: actor}
	if err := decide(p); err != nil {
		return Operation{}, err
	}
	if p.r == nil {
		return seen, nil
	}
	return p.r.op, p.r.flush(ctx, tx)
}

// Seen is the operation as the person saw it, locked.
func (p *Person) Seen() Operation { return p.seen }

// Stuck is the step the operation waits at, and its definition (false
// when every step is done).
func (p *Person) Stuck() (StepRecord, Step, bool) {
	rec, ok := p.seen.Stuck()
	if !ok {
		return StepRecord{}, Step{}, false
	}
	st, _ := p.def.step(rec.Name)
	return rec, st, true
}

// EffectStands reports whether an external step before the stuck one took
// effect elsewhere while nothing undoes it (the definition has no
// Compensation): a cancel can never end the operation cleanly (cancelAt's
// third case).
func (p *Person) EffectStands() bool {
	if len(p.def.Compensation) > 0 {
		return false
	}
	for _, s := range p.seen.Steps[:p.seen.current()] {
		if s.External() && s.State == StepDone && s.SentAt != nil {
			return true
		}
	}
	return false
}

// Decided makes the person the owner for this transaction, if they are not
// yet, and writes the decision's line on the timeline: detail, about the
// stuck step.
func (p *Person) Decided(detail string) error {
	if p.r == nil {
		took, err := ScanOperation(p.tx.QueryRow(p.ctx, sqlDecide, p.seen.ID, p.at, p.actor))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrStateChanged
		}
		if err != nil {
			return fmt.Errorf("workflow: decide: %w", err)
		}
		took.Steps = p.seen.Steps
		p.r = p.e.runner(p.def, took, p.actor)
		p.r.branch = BranchResolved
	}
	rec, _, _ := p.Stuck()
	return p.r.event(p.ctx, p.tx, StatusNeedsReconciliation, rec.Name, detail, "workflow.sqlDecide")
}

// MarkStep writes the person's word on the stuck step — DONE or FAILED —
// with what they decided as its answer.
func (p *Person) MarkStep(state string, decided json.RawMessage) error {
	return p.r.writeStep(p.ctx, p.tx, p.seen.current(), sqlStepDecided, state, decided)
}

// RunOn runs the local steps after a step marked DONE, in this
// transaction, and leaves the next call, if any, to recovery.
func (p *Person) RunOn() error {
	next, err := p.r.advance(p.ctx, p.tx, false)
	if err != nil || next == nil {
		return err
	}
	return p.r.transition(p.ctx, p.tx, sqlRetryRequested, "workflow.sqlRetryRequested", "the rest is recovery's: "+p.r.record(next.index).Name+" is next")
}

// HandBack hands the operation back to recovery with a fresh budget.
func (p *Person) HandBack() error {
	return p.r.transition(p.ctx, p.tx, sqlRetryRequested, "workflow.sqlRetryRequested", "handed back to recovery")
}

// SetCancelAside clears the operation's cancel request: the person decided
// the workflow runs on.
func (p *Person) SetCancelAside() error {
	if _, err := p.tx.Exec(p.ctx, sqlCancelSetAside, p.r.op.ID, p.r.token); err != nil {
		return fmt.Errorf("workflow: set the cancel aside: %w", err)
	}
	rec, _, _ := p.Stuck()
	return p.r.event(p.ctx, p.tx, StatusNeedsReconciliation, rec.Name,
		"the cancel requested by "+database.Deref(p.seen.CancelRequestedBy)+" is set aside by a person: the workflow runs on", "workflow.sqlCancelSetAside")
}

// Fail is what a step marked FAILED means, as a definite refusal of it
// would: the operation FAILS (the earlier steps undone), or a person
// decides again.
func (p *Person) Fail(why string) error {
	return p.r.refuse(p.ctx, p.tx, p.seen.current(), why)
}
