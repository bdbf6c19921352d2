package operations

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is how a person retries a stopped operation from one of its
// steps — Temporal's "reset", for the one case where it is safe without
// replaying anything: the step's outcome is known not to have taken effect,
// and nothing after it ran.
//
// A retry is a new run, as a resume (workflow.Restart) is: a step never moves
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
	ErrRetryNotStopped     = errors.New("operations: only a FAILED operation, or one waiting for a person, is retried from a step")
	ErrRetryNoSuchStep     = errors.New("operations: the workflow has no such step")
	ErrRetryStepUnknown    = errors.New("operations: the step's outcome is unknown: its truth is learned first, never guessed by sending it again")
	ErrRetryStepTookEffect = errors.New("operations: the step took effect: running it again would do it twice")
	ErrRetryStepNotNext    = errors.New("operations: the operation did not stop at that step")
	ErrRetryAfterUndo      = errors.New("operations: what the earlier steps did was undone: this run cannot go on")
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
func RetryableFrom(engine *workflow.Engine, op workflow.Operation, step string) error {
	def, ok := engine.Definition(op.Type)
	if !ok {
		return fmt.Errorf("operations: no definition for %q", op.Type)
	}
	return retryableFrom(def, op, step)
}

// RetryCandidate is the step op would be retried from — the one it stopped
// at — or the refusal that says why it cannot be (for the page).
func RetryCandidate(engine *workflow.Engine, op workflow.Operation) (string, error) {
	name := ""
	for _, s := range op.Steps {
		if s.State != workflow.StepDone {
			name = s.Name
			break
		}
	}
	return name, RetryableFrom(engine, op, name)
}

func retryableFrom(def workflow.Definition, op workflow.Operation, name string) error {
	refuse := func(kind error, state, why string) error {
		return &RetryRefusal{Kind: kind, Step: name, State: state, Status: op.Status, Why: why}
	}
	if op.Status != workflow.StatusFailed && op.Status != workflow.StatusNeedsReconciliation {
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
	case at < 0 && slices.ContainsFunc(def.Compensation, func(s workflow.Step) bool { return s.Name == name }):
		return refuse(ErrRetryStepNotNext, "", name+" is a compensation: a person decides it on the reconciliation desk")
	case at < 0:
		return refuse(ErrRetryNoSuchStep, "", fmt.Sprintf("a %s has no step %q", def.Type, name))
	case at == 0:
		return refuse(ErrRetryStepNotNext, workflow.StepDone, name+" is the request's intent: resume runs the whole workflow again")
	case len(op.Steps) != len(def.Steps):
		return refuse(ErrRetryAfterUndo, "", "it was cancelled and its compensations ran: what its steps did was undone on purpose")
	}
	steps := map[string]workflow.StepRecord{}
	for _, s := range op.Steps {
		steps[s.Name] = s
	}
	for _, s := range def.Steps[:at] {
		switch {
		case steps[s.Name].State != workflow.StepDone:
			return refuse(ErrRetryStepNotNext, steps[name].State, fmt.Sprintf("it stopped at %s, before %s: retry from %s", s.Name, name, s.Name))
		case s.Undo != nil && op.Status == workflow.StatusFailed:
			// A FAILED run ran every earlier step's Undo (workflow/run.go, undoAndFail).
			return refuse(ErrRetryAfterUndo, steps[name].State, s.Name+" was undone when the operation failed: a new request starts afresh")
		}
	}
	rec := steps[name]
	switch rec.State {
	case workflow.StepDone:
		return refuse(ErrRetryStepTookEffect, rec.State, name+" is DONE: it took effect, and again would be twice")
	case workflow.StepSent, workflow.StepUnknown:
		return refuse(ErrRetryStepUnknown, rec.State, name+" was sent and its outcome is unknown: a new key could make it happen twice. "+
			"Its truth is learned first — ask its system on the reconciliation desk")
	}
	for _, s := range def.Steps[at+1:] {
		if st := steps[s.Name].State; st != workflow.StepPending && st != workflow.StepCancelled {
			return refuse(ErrRetryStepNotNext, rec.State, s.Name+", after "+name+", is "+st+": retry from where it stopped")
		}
	}
	return nil
}

// RetryRequest is an admin's request to retry a stopped operation from one
// of its steps.
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
// workflow.ErrStateChanged, *RetryRefusal. The same key come back
// gets the operation as it is.
func RetryFrom(ctx context.Context, engine *workflow.Engine, req RetryRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	// The type never changes, so it is read before the transaction: it
	// names the definition the engine runs.
	op, err := engine.GetOperation(ctx, req.OperationID, 0, true)
	if err != nil {
		return workflow.Operation{}, err
	}
	def, ok := engine.Definition(op.Type)
	if !ok {
		return workflow.Operation{}, fmt.Errorf("operations: no definition for %q", op.Type)
	}
	return engine.Start(ctx, op.Type, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		seen, op, existing, err := engine.RetryFrom(ctx, tx, workflow.RetryFromRequest{
			OperationID: req.OperationID, Step: req.Step, SeenUpdatedAt: req.SeenUpdatedAt,
			RequestKey: req.RequestKey, Actor: req.Actor,
		}, owner, func(seen workflow.Operation) error { return retryableFrom(def, seen, req.Step) })
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
	var refusal *RetryRefusal
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
