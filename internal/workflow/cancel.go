package workflow

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
//     is not a lost lease: the owner stops at that step (cancelAt).
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

// errCancelled is a begin-step write refused by the cancel mark; the
// runner stops there (cancelAt). It never leaves the runner.
var errCancelled = errors.New("workflow: a cancel was requested")

const sqlRequestCancel = `
UPDATE operations
   SET cancel_requested_at = clock_timestamp(), -- after the row lock: later than any step an owner wrote before it
       cancel_requested_by = $2,
       updated_at = now()
 WHERE id = $1
   AND status IN ('IN_PROGRESS', 'RECOVERING') -- 0 rows: finished, or waiting for a person
   AND cancel_requested_at IS NULL -- 0 rows: someone asked first
RETURNING ` + opColumns

// RequestCancel marks operation id cancelled by actor, in tx, and returns
// it as it was just before (seen: the state the request acted on, with its
// steps) and as marked. The owner stops before its next step. Refusals,
// nothing written: ErrNotFound, *NotLiveError, ErrCancelRequested.
func (e *Engine) RequestCancel(ctx context.Context, tx pgx.Tx, id int64, actor string) (seen, marked Operation, err error) {
	if seen, err = e.operation(ctx, tx, id); err != nil {
		return Operation{}, Operation{}, err
	}
	marked, err = scanOperation(tx.QueryRow(ctx, sqlRequestCancel, id, actor))
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
		statement: nameOf(sqlRequestCancel)})
}

// The outcomes of a cancel, as counted in idemlab_workflow_cancels_total.
const (
	CancelStopped     = "stopped"      // nothing done elsewhere stood: stopped, the earlier steps undone, FAILED
	CancelCompensated = "compensating" // what was done elsewhere is being undone by the Compensation steps
	CancelToPerson    = "to_person"    // what was done elsewhere stands and nothing undoes it: a person decides
)

// cancelAt stops the operation at step i, in tx, once a begin-step write
// there was refused by the cancel mark. Step i and those after it have not
// begun — or step i is known never to have taken effect (NOT_STARTED after
// every deadline) — so none of them will run. What happens then depends on
// what the earlier steps did elsewhere. It returns the next call to make
// (a compensation's), if any.
func (r *runner) cancelAt(ctx context.Context, tx pgx.Tx, i int) (*pending, error) {
	var by string
	err := tx.QueryRow(ctx, `
		SELECT cancel_requested_by
		  FROM operations
		 WHERE id = $1
		   AND owner_token = $2 -- still ours
		   FOR UPDATE`, r.op.ID, r.token).Scan(&by)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, fmt.Errorf("workflow: cancel of operation %d: %w", r.op.ID, err)
	}
	var stands []string // the earlier external steps whose effect stands elsewhere
	for j := 0; j < i; j++ {
		if rec := r.record(j); rec.External() && rec.State == StepDone && rec.SentAt != nil {
			stands = append(stands, rec.Name+" ("+*rec.System+")")
		}
	}
	stopped := r.record(i).Name
	switch {
	case len(stands) == 0:
		r.e.metrics.cancels.WithLabelValues(r.def.Type, CancelStopped).Inc()
		if err := r.cancelSteps(ctx, tx, i); err != nil {
			return nil, err
		}
		return nil, r.undoAndFail(ctx, tx, i, fmt.Sprintf("cancelled by %s before %s: nothing had been done elsewhere", by, stopped))
	case len(r.def.Compensation) > 0:
		r.e.metrics.cancels.WithLabelValues(r.def.Type, CancelCompensated).Inc()
		if err := r.cancelSteps(ctx, tx, i); err != nil {
			return nil, err
		}
		if err := r.insertCompensation(ctx, tx); err != nil {
			return nil, err
		}
		if err := r.event(ctx, tx, r.op.Status, stopped, fmt.Sprintf("cancelled by %s before %s; %s had already taken effect, "+
			"so it is undone: %s", by, stopped, strings.Join(stands, ", "), r.compensationNames()), sqlStepsCancelled); err != nil {
			return nil, err
		}
		return r.advance(ctx, tx, true)
	default:
		r.e.metrics.cancels.WithLabelValues(r.def.Type, CancelToPerson).Inc()
		return nil, r.reconcile(ctx, tx, nil, fmt.Sprintf("cancelled by %s before %s, but %s had already taken effect "+
			"and nothing undoes it automatically", by, stopped, strings.Join(stands, ", ")))
	}
}

// sqlStepsCancelled marks step $4 (by position) and every later one not
// begun CANCELLED. Step $4 itself may be SENT or UNKNOWN only when it is
// known never to have taken effect (the caller's rule).
const sqlStepsCancelled = ownerCTE + `
UPDATE operation_steps s
   SET state = 'CANCELLED',
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND (s.position > $4 AND s.state = 'PENDING'
        OR s.position = $4 AND s.state IN ('PENDING', 'SENT', 'UNKNOWN'))
RETURNING ` + stepColumns

func (r *runner) cancelSteps(ctx context.Context, tx pgx.Tx, i int) error {
	rows, err := tx.Query(ctx, sqlStepsCancelled, r.op.ID, r.token, r.op.Run, r.record(i).Position)
	if err != nil {
		return fmt.Errorf("workflow: cancel steps: %w", err)
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) { return scanStep(row) })
	if err != nil {
		return fmt.Errorf("workflow: cancel steps: %w", err)
	}
	if len(steps) == 0 {
		return r.whyNoRows(ctx, tx, "no step left to cancel")
	}
	for _, got := range steps {
		for j := range r.op.Steps {
			if r.op.Steps[j].Name == got.Name {
				r.op.Steps[j] = got
			}
		}
	}
	return nil
}

// insertCompensation lays out the definition's compensation steps after
// the run's steps, PENDING, each under its own step key.
func (r *runner) insertCompensation(ctx context.Context, tx pgx.Tx) error {
	last := r.record(len(r.op.Steps) - 1).Position
	for k, s := range r.def.Compensation {
		var system *string
		if s.Call != nil {
			system = ptr(s.Call.System())
		}
		rec, err := scanStep(tx.QueryRow(ctx, `
			INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state)
			VALUES ($1, $2, $3, $4, $5, $6, 'PENDING')
			RETURNING `+stepColumns, r.op.ID, r.op.Run, last+1+k, s.Name, StepKey(r.op.ID, s.Name, r.op.Run), system))
		if err != nil {
			return fmt.Errorf("workflow: insert compensation %s: %w", s.Name, err)
		}
		r.op.Steps = append(r.op.Steps, rec)
	}
	return nil
}

func (r *runner) compensationNames() string {
	names := make([]string, len(r.def.Compensation))
	for k, s := range r.def.Compensation {
		names[k] = s.Name
	}
	return strings.Join(names, " then ")
}

// compensation reports whether step name is one of the definition's
// compensations: the cancel mark does not stop those.
func (def *Definition) compensation(name string) bool {
	for _, s := range def.Compensation {
		if s.Name == name {
			return true
		}
	}
	return false
}

// cancelled reports whether the operation stopped for a cancel and is
// compensating (a step of its run is CANCELLED): its end is FAILED, not
// SUCCEEDED, once the compensations are done.
func (op Operation) cancelled() bool {
	for _, s := range op.Steps {
		if s.State == StepCancelled {
			return true
		}
	}
	return false
}

// IsCancelRefusal reports whether err is a refusal of RequestCancel
// (nothing written).
func IsCancelRefusal(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotLive) || errors.Is(err, ErrCancelRequested)
}
