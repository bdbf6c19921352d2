package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/external"
)

// Definition is one kind of workflow: the operation type it runs under and
// its steps, in order. The first step records the intent: the workflow's
// start function writes it (Engine.Start), so it has no Do.
//
// A definition is data; the engine runs every definition the same way —
// requests, recovery and a person's decisions alike — so a new workflow
// (the deposit saga) is a new Definition and a start function, nothing else.
type Definition struct {
	Type  string
	Steps []Step
	// Compensation is what undoes the steps' effects elsewhere when a
	// person cancels the operation after an external step took effect (a
	// refund of a charge that went through): steps like the others, run
	// in order after the cancelled ones, under their own step keys, by the
	// same code (cancel.go). Nil: nothing undoes them automatically, so a
	// person decides.
	Compensation []Step
	// CrashAliases keeps older crash point names working: each alias
	// fires where the point it names does.
	CrashAliases map[crash.Point]crash.Point
}

// Step is one step of a workflow: local (Do) or external (Call).
type Step struct {
	Name string
	// Do is a local step: it writes in the transaction that reaches it,
	// together with its neighbours — the previous external step's outcome,
	// the next one's SENT — and needs no bookkeeping of its own: a crash
	// rolls it back with them, and whoever resumes replays it. detail says
	// what it did, for the timeline.
	Do func(ctx context.Context, tx pgx.Tx, op Operation) (detail string, err error)
	// Call is an external step: another system is asked to do something
	// under the step's key.
	Call Caller
	// Refused is what a definite refusal of Call means for the operation.
	Refused Refusal
	// Undo reverses a local step — the first step too — when the operation
	// fails at a later step (release a hold). It runs in the transaction
	// that records the failure, which only a definite refusal leads to.
	// Nil: nothing to reverse.
	Undo func(ctx context.Context, tx pgx.Tx, op Operation) (detail string, err error)
	// Abandon is asked by recovery when the truth of an external step's key
	// is NOT_STARTED and conclusive (every earlier attempt's deadline has
	// passed, so no call of it can still arrive): the call is known never
	// to have taken effect. A non-empty why means the business no longer
	// wants it sent (a hold whose time is up): the step FAILS as if
	// refused, and the earlier steps' Undo run. "" (or a nil Abandon): the
	// same call again, same key. It is never asked while the outcome is
	// unknown — that is exactly when giving up would be a guess. at is the
	// engine's clock (database.Clock.Arg) for comparisons with now().
	Abandon func(ctx context.Context, tx pgx.Tx, op Operation, at *time.Time) (why string, err error)
}

// Refusal is what a definite refusal of an external step means.
type Refusal int

const (
	// FailOperation: nothing outside PostgreSQL has been done yet (or what
	// was done is undone by the earlier steps' Undo), so the operation
	// ends FAILED and may be started again.
	FailOperation Refusal = iota
	// Reconcile: an earlier step's effect elsewhere stands and cannot be
	// taken back automatically (a cancelled policy whose refund is
	// refused): a person decides.
	Reconcile
)

// Caller is what an external step needs from the system it calls. The
// systems' clients are wrapped by their workflows (internal/policies) so the
// engine never learns what a cancellation or a refund is.
type Caller interface {
	// System names the system, as in external_systems: "provider", "payments".
	System() string
	// Request computes the call's request, once, in the transaction that
	// first records the step SENT. It is stored with the step and every
	// retry sends it verbatim. Returning Skip(why) makes the step DONE
	// without a call (a refund of nothing).
	Request(ctx context.Context, tx pgx.Tx, op Operation) (any, error)
	// Deadline is the Request-Deadline a call prepared now carries; the
	// step records it before the call is made.
	Deadline() time.Time
	// Send makes the call. A non-nil error means nothing was sent.
	Send(ctx context.Context, call Call) (external.Result, error)
	// Status asks the system for the truth of key. An error wrapping
	// external.ErrUnreachable means it cannot be learned right now.
	Status(ctx context.Context, key string) (external.Truth, error)
}

// Call is one call of an external step, as its Caller sends it.
type Call struct {
	Key      string
	Deadline time.Time
	Request  json.RawMessage
}

// Skip, returned by Caller.Request, makes the step DONE without a call.
func Skip(why string) error { return &skipped{why: why} }

type skipped struct{ why string }

func (s *skipped) Error() string { return "workflow: step skipped: " + s.why }

// CrashPoints lists the points where a process running def can be made to
// die, in the order a run passes them, then def's aliases (docs/api.md,
// docs/workflows.md):
//
//	after_{local step}    in the step's transaction, once it is written: a
//	                      crash there rolls the whole transaction back
//	before_{external}     its SENT committed, the call not made
//	after_{external}      the call made, its outcome not recorded
//	after_commit          a request's last commit made (outcome and answer
//	                      stored), the answer not sent
func CrashPoints(def Definition) []crash.Point {
	var points []crash.Point
	for i, s := range def.Steps {
		if i == 0 || s.Do != nil {
			points = append(points, crashAfter(s.Name))
		} else {
			points = append(points, crashBefore(s.Name), crashAfter(s.Name))
		}
	}
	points = append(points, CrashAfterCommit)
	return append(points, slices.Sorted(maps.Keys(def.CrashAliases))...)
}

// CrashAfterCommit is passed by a request after its last commit.
const CrashAfterCommit crash.Point = "after_commit"

func crashBefore(step string) crash.Point { return crash.Point("before_" + step) }
func crashAfter(step string) crash.Point  { return crash.Point("after_" + step) }

func (def *Definition) validate() error {
	if def.Type == "" || len(def.Steps) < 2 {
		return errors.New("workflow: a definition needs a type and at least two steps")
	}
	seen := map[string]bool{}
	for _, s := range def.Compensation {
		if s.Name == "" || (s.Do == nil) == (s.Call == nil) {
			return fmt.Errorf("workflow: %s: a compensation step needs a name and must be local (Do) or external (Call)", def.Type)
		}
	}
	for i, s := range append(slices.Clone(def.Steps), def.Compensation...) {
		if i >= len(def.Steps) { // a compensation: checked above, its name below
			if seen[s.Name] {
				return fmt.Errorf("workflow: %s: compensation step %s repeats a name", def.Type, s.Name)
			}
			seen[s.Name] = true
			continue
		}
		switch {
		case s.Name == "" || seen[s.Name]:
			return fmt.Errorf("workflow: %s: step %d has no name or a repeated one", def.Type, i+1)
		case i == 0 && (s.Do != nil || s.Call != nil):
			return fmt.Errorf("workflow: %s: the first step is the start function's; it has no Do or Call", def.Type)
		case i > 0 && (s.Do == nil) == (s.Call == nil):
			return fmt.Errorf("workflow: %s: step %s must be local (Do) or external (Call)", def.Type, s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

func (def *Definition) step(name string) (Step, bool) {
	for _, s := range append(def.Steps[:len(def.Steps):len(def.Steps)], def.Compensation...) {
		if s.Name == name {
			return s, true
		}
	}
	return Step{}, false
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
