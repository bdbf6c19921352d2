package reconciliation

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is what a person does with an operation recovery could not
// finish: a decision — which fits the step it is stuck at, and what each
// means — checked against the evidence as the desk reads it in the
// decision's own transaction, written by the engine through the same
// fenced code path as requests and recovery (workflow.Engine.Decide: the
// person owns the operation for that one transaction), and recorded in the
// desk's audit trail in the same commit.

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

// ErrResolutionNotAllowed: the decision does not fit the step.
var ErrResolutionNotAllowed = errors.New("reconciliation: that decision does not fit this step")

// fits refuses a decision that does not fit the step the operation is
// stuck at, whatever the evidence says.
func fits(p *workflow.Person, r Resolution) error {
	seen := p.Seen()
	stuck, step, ok := p.Stuck()
	switch {
	case !ok:
		return fmt.Errorf("%w: every step is done", ErrResolutionNotAllowed)
	case r == ResolveFailed && step.Refused != workflow.FailOperation:
		return fmt.Errorf("%w: %s cannot be marked failed — what the earlier steps did elsewhere stands; "+
			"mark it done once it is done by hand, or retry", ErrResolutionNotAllowed, stuck.Name)
	case r != ResolveRetry && !stuck.External() && seen.CancelRequestedAt != nil:
		// A local step is the workflow's own write: marking it done would
		// skip what it writes. Only recovery runs it (a cancelled
		// operation handed to a person stops at one: workflow/cancel.go).
		return fmt.Errorf("%w: %s is a step of this database's own: retry runs it", ErrResolutionNotAllowed, stuck.Name)
	case r == ResolveRetry && stuck.State == workflow.StepFailed:
		return fmt.Errorf("%w: %s was refused definitely; the same call would be refused again", ErrResolutionNotAllowed, stuck.Name)
	}
	return nil
}

// apply writes decision req through the person, each write fenced by the
// engine; note ends each of its timeline lines (who decided, seeing what).
func apply(p *workflow.Person, req ResolveRequest, note string) error {
	stuck, _, _ := p.Stuck()
	decided, _ := json.Marshal(map[string]string{"decided_by": req.Actor, "decision": string(req.Resolution), "note": req.Note})
	switch req.Resolution {
	case ResolveDone:
		if err := p.Decided("a person confirmed that " + stuck.Name + " happened: marked done" + note); err != nil {
			return err
		}
		if err := p.MarkStep(workflow.StepDone, decided); err != nil {
			return err
		}
		return p.RunOn()
	case ResolveRetry:
		if err := p.Decided("a person asked for a retry: handed back to recovery, which asks " + database.Deref(stuck.System) + " first" + note); err != nil {
			return err
		}
		if p.Seen().CancelRequestedAt != nil && (!stuck.External() || p.EffectStands()) {
			// Cancelled after an effect nothing undoes: the person decided
			// the workflow runs on, so the cancel request is set aside —
			// at a local step, and at an external one (its truth may be
			// NOT_STARTED) when an earlier effect stands with no
			// compensation: kept, the cancel would only stop it there and
			// hand it back to a person, again and again.
			if err := p.SetCancelAside(); err != nil {
				return err
			}
		}
		return p.HandBack()
	default:
		if err := p.Decided("a person marked " + stuck.Name + " failed: it did not happen and will not" + note); err != nil {
			return err
		}
		if err := p.MarkStep(workflow.StepFailed, decided); err != nil {
			return err
		}
		return p.Fail("marked failed by a person" + note)
	}
}

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

// DecisionWords says a decision in a person's words, as the desk's notice
// and its list of decisions show it: the action's code name ("mark_done")
// is the API's, not the page's.
func DecisionWords(action string) string {
	if action == "retry_from" { // written by a retry from a step (operations/retry.go), not a desk decision
		return "retried from the step it stopped at, as a new run"
	}
	r, ok := ParseResolution(action)
	if !ok {
		return action
	}
	switch r {
	case ResolveDone:
		return "marked done: the step happened"
	case ResolveRetry:
		return "handed back to recovery, which asks again first"
	default:
		return "marked failed: the step did not happen"
	}
}

// ResolveRequest is one person's decision on one operation, with the state
// they saw when they made it.
type ResolveRequest struct {
	OperationID   int64
	Resolution    Resolution
	SeenUpdatedAt time.Time // the operation's updated_at as shown
	Actor         string    // "admin (request … on app-1)"
	Note          string    // why, in their words (optional)
	// DecidedBy names the person (their user name) in the audit trail.
	DecidedBy string
	// TruthSeen is the truth now the page showed ("" or UNKNOWN: no answer).
	TruthSeen string
	// Desk is how the evidence is read: the advice Resolve checks the
	// decision against is the one the desk shows.
	Desk Config
	// BatchSize is how many decisions the person made with this one click.
	BatchSize int
	// OnlyIfSuggested: apply only where the truth now makes this very
	// decision unambiguous (a bulk decision); otherwise not_allowed.
	OnlyIfSuggested bool
}

// Decided is the outcome of one decision of a batch.
type Decided struct {
	OperationID int64  `json:"operation_id"`
	Decision    string `json:"decision"`
	// Outcome: decided · state_changed (someone else, or recovery, got
	// there first) · not_allowed (the evidence rules it out) · not_found
	Outcome string `json:"outcome"`
	Detail  string `json:"detail,omitempty"`
	Status  string `json:"status,omitempty"` // the operation's status after the decision
}

// Outcomes of one decision of a batch.
const (
	OutcomeDecided      = "decided"
	OutcomeStateChanged = "state_changed"
	OutcomeNotAllowed   = "not_allowed"
	OutcomeNotFound     = "not_found"
)

// Resolve applies a person's decision in one transaction: hooks.Begin, the
// decision and its timeline events, hooks.Finish with the operation. A
// refusal — workflow.ErrStateChanged (not as they saw it),
// workflow.ErrNotFound, ErrResolutionNotAllowed — goes to
// hooks.Finish in the same transaction, commits with Begin, and is returned
// wrapped in workflow.Refused.
func (d *Desk) Resolve(ctx context.Context, req ResolveRequest, hooks workflow.Hooks[workflow.Operation]) (workflow.Operation, error) {
	var op workflow.Operation
	var refusal error
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		refusal = nil
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		var err error
		op, err = d.resolve(ctx, tx, req)
		if refused(err) {
			refusal = workflow.Refused(err)
			return hooks.RunFinish(ctx, tx, workflow.Operation{}, refusal)
		}
		if err != nil {
			return err
		}
		return hooks.RunFinish(ctx, tx, op, nil)
	})
	switch {
	case err != nil:
		return workflow.Operation{}, err
	case refusal != nil:
		return workflow.Operation{}, refusal
	}
	return op, nil
}

// refused reports whether err is a decision's refusal (nothing written).
func refused(err error) bool {
	return errors.Is(err, workflow.ErrStateChanged) || errors.Is(err, workflow.ErrNotFound) ||
		errors.Is(err, ErrResolutionNotAllowed)
}

// resolve decides one operation in tx: the engine locks it as the person
// saw it and checks the decision fits the step; the desk then refuses a
// decision the evidence, read in this transaction, rules out — whatever the
// page showed when it was rendered — and records it in the audit trail.
func (d *Desk) resolve(ctx context.Context, tx pgx.Tx, req ResolveRequest) (workflow.Operation, error) {
	var item Item
	op, err := d.engine.Decide(ctx, tx, req.OperationID, req.SeenUpdatedAt, req.Actor, func(p *workflow.Person) error {
		if err := fits(p, req.Resolution); err != nil {
			return err
		}
		items, err := d.items(ctx, tx, req.Desk, []workflow.Operation{p.Seen()})
		if err != nil {
			return err
		}
		item = items[0]
		if choice, ok := item.Advice.Action(string(req.Resolution)); ok && !choice.Enabled {
			return fmt.Errorf("%w: %s", ErrResolutionNotAllowed, choice.Disabled)
		}
		if req.OnlyIfSuggested && (!item.Advice.Unambiguous || item.Advice.Suggested != string(req.Resolution)) {
			return fmt.Errorf("%w: the truth now (%s) does not make %s unambiguous; decide it on its own card",
				ErrResolutionNotAllowed, item.Truth(), req.Resolution)
		}
		note := fmt.Sprintf(" (by %s, seeing %s)", cmp.Or(req.DecidedBy, req.Actor), strings.TrimSpace(item.Facts.System+" "+truthSeen(req.TruthSeen)))
		if req.Note != "" {
			note += " — " + req.Note
		}
		return apply(p, req, note)
	})
	if err != nil {
		return workflow.Operation{}, err
	}
	return op, recordDecision(ctx, tx, req, item)
}

func truthSeen(t string) string {
	if t == "" {
		return TruthUnknown
	}
	return t
}

// recordDecision writes the decision's line of the audit trail, in the
// decision's transaction.
func recordDecision(ctx context.Context, tx pgx.Tx, req ResolveRequest, item Item) error {
	var callID *int64
	var truth *string
	if c := item.NowCall; c != nil {
		callID, truth = &c.ID, c.Truth
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO reconciliation_decisions (operation_id, step_key, decided_by, actor, decision, seen_updated_at,
		                                      truth_seen, truth_call_id, truth_at_decision, suggested, batch_size, note)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		req.OperationID, item.Stuck.Key, cmp.Or(req.DecidedBy, req.Actor), req.Actor, string(req.Resolution), req.SeenUpdatedAt,
		truthSeen(req.TruthSeen), callID, truth, item.Advice.Suggested, max(req.BatchSize, 1), req.Note)
	if err != nil {
		return fmt.Errorf("reconciliation: record the decision: %w", err)
	}
	return nil
}

// ResolveMany applies a batch of decisions — one click on the desk — in
// one transaction: hooks.Begin, every decision in the order of the
// operations' ids (two batches over the same operations lock them in the
// same order, so they queue instead of deadlocking), hooks.Finish with the
// outcomes. Each decision is conditional on the state its person saw, as
// in Resolve: of two admins deciding the same items at once, one wins per
// item and the other's outcome says state_changed. A refusal of one item
// writes nothing for it and does not stop the others.
func (d *Desk) ResolveMany(ctx context.Context, reqs []ResolveRequest, hooks workflow.Hooks[[]Decided]) ([]Decided, error) {
	reqs = slices.Clone(reqs)
	slices.SortFunc(reqs, func(a, b ResolveRequest) int { return cmp.Compare(a.OperationID, b.OperationID) })
	reqs = slices.CompactFunc(reqs, func(a, b ResolveRequest) bool { return a.OperationID == b.OperationID })
	var out []Decided
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		out = make([]Decided, 0, len(reqs))
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		for _, req := range reqs {
			req.BatchSize = len(reqs)
			dec := Decided{OperationID: req.OperationID, Decision: string(req.Resolution), Outcome: OutcomeDecided}
			op, err := d.resolve(ctx, tx, req)
			switch {
			case errors.Is(err, workflow.ErrStateChanged):
				dec.Outcome, dec.Detail = OutcomeStateChanged, err.Error()
			case errors.Is(err, workflow.ErrNotFound):
				dec.Outcome, dec.Detail = OutcomeNotFound, err.Error()
			case errors.Is(err, ErrResolutionNotAllowed):
				dec.Outcome, dec.Detail = OutcomeNotAllowed, err.Error()
			case err != nil:
				return err
			default:
				dec.Status = op.Status
			}
			out = append(out, dec)
		}
		return hooks.RunFinish(ctx, tx, out, nil)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
