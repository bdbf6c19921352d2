package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// This file is how a person retries a stopped operation from one of its
// steps — Temporal's "reset", for the one case where it is safe without
// replaying anything: the step's outcome is known not to have taken effect,
// and nothing after it ran.
//
// A retry is a new run, as a resume (Restart) is: a step never moves
// backwards, and the retried step goes under a new key ({op}:{step}:{run}),
// so its system gets a new request, never the refused one again. Unlike a
// resume, the steps before it are not run again: they are carried into the
// new run as copies, DONE, under the keys they were done with
// (carried_from_run), so no call of theirs is ever sent twice. The case
// that needs it: a cancellation whose refund was refused — the provider
// cancelled the policy, which stands; the refund is tried again under a new
// key once the customer's payment details are fixed.
//
// The rule (RetryableFrom), every part of it for a reason:
//
//   - the operation is stopped: FAILED, or waiting for a person. A live one
//     belongs to its owner; cancel it first.
//   - the step is one of the workflow's own after the intent (the intent is
//     the request's: a resume starts again from it; a compensation is the
//     desk's to decide);
//   - every step before it is DONE: what they did stands and is carried;
//   - the step itself is known not to have taken effect: FAILED (a definite
//     refusal, or a person's word) or never sent (PENDING, CANCELLED).
//     Never DONE (it took effect: again would be twice) and never SENT or
//     UNKNOWN (nobody knows what it did: its truth is learned first — the
//     desk asks — never guessed by sending it again under another key);
//   - nothing after it ran, and nothing before it was undone (an earlier
//     step's Undo ran when the operation failed, or its compensations ran
//     after a cancel): the steps to carry would no longer be what DONE says.

// The refusals of a retry from a step, each a *RetryRefusal.
var (
	ErrRetryNotStopped     = errors.New("workflow: only a FAILED operation, or one waiting for a person, is retried from a step")
	ErrRetryNoSuchStep     = errors.New("workflow: the workflow has no such step")
	ErrRetryStepUnknown    = errors.New("workflow: the step's outcome is unknown: its truth is learned first, never guessed by sending it again")
	ErrRetryStepTookEffect = errors.New("workflow: the step took effect: running it again would do it twice")
	ErrRetryStepNotNext    = errors.New("workflow: the operation did not stop at that step")
	ErrRetryAfterUndo      = errors.New("workflow: what the earlier steps did was undone: this run cannot go on")
)

// RetryRefusal says why a retry from Step was refused; it unwraps to one of
// the errors above.
type RetryRefusal struct {
	Kind   error
	Step   string
	State  string // the step's state ("" for no such step)
	Status string // the operation's
	Why    string // in words, for the page and the problem's detail
}

func (e *RetryRefusal) Error() string { return e.Why }
func (e *RetryRefusal) Unwrap() error { return e.Kind }

// RetryableFrom reports whether op may be retried from its step named step:
// nil, or a *RetryRefusal that says why not.
func (e *Engine) RetryableFrom(op Operation, step string) error {
	def, ok := e.defs[op.Type]
	if !ok {
		return fmt.Errorf("workflow: no definition for %q", op.Type)
	}
	return def.retryableFrom(op, step)
}

// RetryCandidate is the step op would be retried from — the one it stopped
// at — or the refusal that says why it cannot be (for the page).
func (e *Engine) RetryCandidate(op Operation) (string, error) {
	name := ""
	for _, s := range op.Steps {
		if s.State != StepDone {
			name = s.Name
			break
		}
	}
	return name, e.RetryableFrom(op, name)
}

func (def *Definition) retryableFrom(op Operation, name string) error {
	refuse := func(kind error, state, why string) error {
		return &RetryRefusal{Kind: kind, Step: name, State: state, Status: op.Status, Why: why}
	}
	if op.Status != StatusFailed && op.Status != StatusNeedsReconciliation {
		why := "it is " + op.Status + ": nothing to retry"
		if !op.Terminal() {
			why = "it is " + op.Status + ": someone is running it (cancel it first, or wait for its end)"
		}
		return refuse(ErrRetryNotStopped, "", why)
	}
	at := -1
	for i, s := range def.Steps {
		if s.Name == name {
			at = i
		}
	}
	switch {
	case at < 0 && def.compensation(name):
		return refuse(ErrRetryStepNotNext, "", name+" is a compensation: a person decides it on the reconciliation desk")
	case at < 0:
		return refuse(ErrRetryNoSuchStep, "", fmt.Sprintf("a %s has no step %q", def.Type, name))
	case at == 0:
		return refuse(ErrRetryStepNotNext, StepDone, name+" is the request's intent: resume runs the whole workflow again")
	case len(op.Steps) != len(def.Steps):
		return refuse(ErrRetryAfterUndo, "", "it was cancelled and its compensations ran: what its steps did was undone on purpose")
	}
	steps := map[string]StepRecord{}
	for _, s := range op.Steps {
		steps[s.Name] = s
	}
	for _, s := range def.Steps[:at] {
		switch {
		case steps[s.Name].State != StepDone:
			return refuse(ErrRetryStepNotNext, steps[name].State, fmt.Sprintf("it stopped at %s, before %s: retry from %s", s.Name, name, s.Name))
		case s.Undo != nil && op.Status == StatusFailed:
			// A FAILED run ran every earlier step's Undo (undoAndFail).
			return refuse(ErrRetryAfterUndo, steps[name].State, s.Name+" was undone when the operation failed: a new request starts afresh")
		}
	}
	rec := steps[name]
	switch rec.State {
	case StepDone:
		return refuse(ErrRetryStepTookEffect, rec.State, name+" is DONE: it took effect, and again would be twice")
	case StepSent, StepUnknown:
		return refuse(ErrRetryStepUnknown, rec.State, name+" was sent and its outcome is unknown: a new key could make it happen twice. "+
			"Its truth is learned first — ask its system on the reconciliation desk")
	}
	for _, s := range def.Steps[at+1:] {
		if st := steps[s.Name].State; st != StepPending && st != StepCancelled {
			return refuse(ErrRetryStepNotNext, rec.State, s.Name+", after "+name+", is "+st+": retry from where it stopped")
		}
	}
	return nil
}

// RetryFromRequest is a person's retry of one operation from one step.
type RetryFromRequest struct {
	OperationID   int64
	Step          string
	SeenUpdatedAt time.Time // the operation's updated_at as the person saw it
	RequestKey    string    // the request's Idempotency-Key: the new run answers it
	Actor         string    // "admin (request … on app-1)", on the timeline
}

// sqlRetryFrom starts the stopped operation again as its next run, from a
// step: conditional on the state the person saw, like a desk decision, so
// of two people retrying at once one wins, and a retry never runs over a
// decision or a recovery that came first.
const sqlRetryFrom = `
UPDATE operations
   SET status = 'IN_PROGRESS',
       run = run + 1,
       idempotency_key = $2,
       owner_token = gen_random_uuid(),
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       released = NULL,
       attempts = 0,
       next_attempt_at = NULL,
       last_error = NULL,
       finished_at = NULL,
       cancel_requested_at = NULL, -- a new run is not the cancelled one
       cancel_requested_by = NULL,
       updated_at = now()
 WHERE id = $1
   AND status IN ('FAILED', 'NEEDS_RECONCILIATION')
   AND updated_at = $5 -- 0 rows: it changed since it was shown
RETURNING ` + opColumns

// sqlCarrySteps lays out the new run ($2): the steps before position $3
// carried from the run before, as they were done (same key, same answer,
// carried_from_run the run that did them); the retried step and the rest
// PENDING under the new run's keys ($4 names, $5 keys, $6 systems, from
// position $3 on), the retried step with its request as first computed
// ($7: the same refund, under a new key).
const sqlCarrySteps = `
INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, attempts, deadline_at,
                             sent_at, finished_at, request, answer, truth, carried_from_run)
SELECT operation_id, $2, position, name, step_key, system, 'DONE', attempts, deadline_at,
       sent_at, finished_at, request, answer, truth, coalesce(carried_from_run, run)
  FROM operation_steps
 WHERE operation_id = $1
   AND run = $2 - 1
   AND position < $3
   AND state = 'DONE' -- RetryableFrom checked it under the operation's lock
UNION ALL
SELECT $1, $2, $3 + s.n - 1, s.name, s.step_key, s.system, 'PENDING', 0, NULL,
       NULL, NULL, CASE WHEN s.n = 1 THEN $7::jsonb END, NULL, NULL, NULL
  FROM unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS s(name, step_key, system, n)
RETURNING ` + stepColumns

// RetryFrom starts the operation again from req.Step in tx, as its next
// run owned by owner, and returns it with the new run's steps laid out —
// a StartFunc's work, for Engine.Start, which runs it from there — and seen,
// the operation as the person acted on it. existing is true when the
// request that made this retry came back (same key): nothing is done again.
// Refusals, nothing written: ErrNotFound, ErrStateChanged, *RetryRefusal.
func (e *Engine) RetryFrom(ctx context.Context, tx pgx.Tx, req RetryFromRequest, owner Owner) (seen, op Operation, existing bool, err error) {
	var locked int64
	err = tx.QueryRow(ctx, `SELECT id FROM operations WHERE id = $1 FOR UPDATE`, req.OperationID).Scan(&locked)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, Operation{}, false, ErrNotFound
	}
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: %w", req.OperationID, err)
	}
	if seen, err = e.operation(ctx, tx, req.OperationID); err != nil {
		return Operation{}, Operation{}, false, err
	}
	if seen.IdempotencyKey == req.RequestKey {
		return seen, seen, true, nil // this request's own run, come back after a crash
	}
	if !seen.UpdatedAt.Equal(req.SeenUpdatedAt) {
		return Operation{}, Operation{}, false, ErrStateChanged
	}
	def, ok := e.defs[seen.Type]
	if !ok {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: no definition for %q", seen.Type)
	}
	if err := def.retryableFrom(seen, req.Step); err != nil {
		return Operation{}, Operation{}, false, err
	}
	op, err = scanOperation(tx.QueryRow(ctx, sqlRetryFrom, seen.ID, req.RequestKey, owner.ID, owner.Lease.Seconds(), req.SeenUpdatedAt))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, Operation{}, false, ErrStateChanged
	}
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: %w", seen.ID, err)
	}

	var from StepRecord
	var names, keys []string
	var systems []*string
	var carried []string
	for _, s := range seen.Steps {
		switch {
		case s.Name == req.Step:
			from = s
		case from.Name == "":
			carried = append(carried, s.Name)
			continue
		}
		names, keys, systems = append(names, s.Name), append(keys, StepKey(op.ID, s.Name, op.Run)), append(systems, s.System)
	}
	rows, err := tx.Query(ctx, sqlCarrySteps, op.ID, op.Run, from.Position, names, keys, systems, from.Request)
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: lay out run %d: %w", op.ID, op.Run, err)
	}
	if op.Steps, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) { return scanStep(row) }); err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: lay out run %d: %w", op.ID, op.Run, err)
	}
	if len(op.Steps) != len(seen.Steps) {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: run %d has %d steps, run %d had %d", op.ID, op.Run, len(op.Steps), seen.Run, len(seen.Steps))
	}
	orderSteps(op.Steps)
	detail := fmt.Sprintf("retried from %s: run %d — %s under a new key %s", req.Step, op.Run, req.Step, StepKey(op.ID, req.Step, op.Run))
	if len(carried) > 0 {
		detail += fmt.Sprintf("; %s carried over from run %d, done and not sent again", strings.Join(carried, ", "), seen.Run)
	}
	if seen.CancelRequestedAt != nil {
		detail += "; the cancel requested by " + database.Deref(seen.CancelRequestedBy) + " is set aside: a new run is not the cancelled one"
	}
	return seen, op, false, recordEvent(ctx, tx, event{op: op, from: seen.Status, actor: req.Actor, step: req.Step,
		detail: detail, statement: "workflow.sqlRetryFrom"})
}

// orderSteps puts a run's steps in their order.
func orderSteps(steps []StepRecord) {
	slices.SortFunc(steps, func(a, b StepRecord) int { return a.Position - b.Position })
}
