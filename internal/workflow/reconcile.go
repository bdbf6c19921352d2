package workflow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	// DecidedBy names the person (their user name) in the audit trail.
	DecidedBy string
	// TruthSeen is the truth now the page showed ("" or UNKNOWN: no answer).
	TruthSeen string
	// Desk is how the evidence is read: the advice Resolve checks the
	// decision against is the one the desk shows.
	Desk DeskConfig
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
	// The evidence as the desk reads it, in this transaction: a decision
	// the latest status answer rules out is refused, whatever the page
	// showed when it was rendered.
	items, err := e.items(ctx, tx, req.Desk, []Operation{seen})
	if err != nil {
		return Operation{}, err
	}
	item := items[0]
	if choice, ok := item.Advice.Action(string(req.Resolution)); ok && !choice.Enabled {
		return Operation{}, fmt.Errorf("%w: %s", ErrResolutionNotAllowed, choice.Disabled)
	}
	if req.OnlyIfSuggested && (!item.Advice.Unambiguous || item.Advice.Suggested != string(req.Resolution)) {
		return Operation{}, fmt.Errorf("%w: the truth now (%s) does not make %s unambiguous; decide it on its own card",
			ErrResolutionNotAllowed, item.Truth(), req.Resolution)
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
	r.ran(sqlDecide, []any{seen.ID, req.SeenUpdatedAt, req.Actor})
	note := fmt.Sprintf(" (by %s, seeing %s %s)", cmp.Or(req.DecidedBy, req.Actor), item.Facts.System, truthSeen(req.TruthSeen))
	if req.Note != "" {
		note += " — " + req.Note
	}
	if err := recordDecision(ctx, tx, req, item); err != nil {
		return Operation{}, err
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
		return fmt.Errorf("workflow: record the decision: %w", err)
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
func (e *Engine) ResolveMany(ctx context.Context, reqs []ResolveRequest, hooks Hooks[[]Decided]) ([]Decided, error) {
	reqs = slices.Clone(reqs)
	slices.SortFunc(reqs, func(a, b ResolveRequest) int { return cmp.Compare(a.OperationID, b.OperationID) })
	reqs = slices.CompactFunc(reqs, func(a, b ResolveRequest) bool { return a.OperationID == b.OperationID })
	var out []Decided
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		out = make([]Decided, 0, len(reqs))
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		for _, req := range reqs {
			req.BatchSize = len(reqs)
			d := Decided{OperationID: req.OperationID, Decision: string(req.Resolution), Outcome: OutcomeDecided}
			op, err := e.resolve(ctx, tx, req)
			switch {
			case errors.Is(err, ErrStateChanged):
				d.Outcome, d.Detail = OutcomeStateChanged, err.Error()
			case errors.Is(err, ErrNotFound):
				d.Outcome, d.Detail = OutcomeNotFound, err.Error()
			case errors.Is(err, ErrResolutionNotAllowed):
				d.Outcome, d.Detail = OutcomeNotAllowed, err.Error()
			case err != nil:
				return err
			default:
				d.Status = op.Status
			}
			out = append(out, d)
		}
		return hooks.RunFinish(ctx, tx, out, nil)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
