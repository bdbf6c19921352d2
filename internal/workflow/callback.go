package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
)

// A callback is the other way a truth arrives: the system tells, instead of
// being asked. It may come at least once, late, out of order, or while a
// recovery worker is asking the same question — so it goes through the same
// gates as an answer:
//
//	inbox      INSERT … ON CONFLICT DO NOTHING on (system, event id): a copy
//	           already received changes nothing (its duplicates are counted)
//	lock       the step's operation row, FOR UPDATE: a concurrent owner's
//	           write (recovery recording what its status query said) commits
//	           first, and what follows reads what it wrote
//	monotonic  only a step in flight (SENT, UNKNOWN) learns an outcome; a
//	           step DONE or FAILED is never moved, so a late RUNNING after
//	           COMPLETED, or a callback that lost the race, changes zero rows
//	           (stale); RUNNING settles nothing (noted)
//	fence      COMPLETED or REJECTED: unless the request that started the
//	           operation still holds its lease (it waits for this call's
//	           own answer: ErrOwnerBusy, nothing written, come again), the
//	           callback takes the operation over
//	           (a new owner token) and records the truth with the fenced
//	           step write recovery uses (learnTruth); the worker that held
//	           the old token is refused at its next write (ErrLeaseLost)
//
// Whichever of the callback and recovery commits first wins; the other
// changes nothing and is counted (a stale callback, a fenced write). The
// inbox row, the step's outcome and the timeline line commit together.

// ErrOwnerBusy: the request that started the operation still owns it and
// waits for the call's own answer; the callback is to come again later
// (the web layer answers 409 with Retry-After, and the sender retries).
var ErrOwnerBusy = errors.New("workflow: the operation's request is still waiting for this call's answer")

// BranchCallback marks the timeline lines written because a system called back.
const BranchCallback = "callback"

// Callback is one callback event, as its system sent it.
type Callback struct {
	System  string // the system that called: "provider", "payments"
	EventID string
	StepKey string         // the key of the call it reports on
	Truth   external.Truth // RUNNING, COMPLETED or REJECTED
	Reason  string
	Attempt int // the sender's delivery attempt
}

// CallbackOutcome is what a callback did.
type CallbackOutcome string

// The outcomes (webhook_inbox.outcome, except duplicate, which is a count).
const (
	CallbackApplied     CallbackOutcome = "applied"      // it settled the step
	CallbackNoted       CallbackOutcome = "noted"        // RUNNING: nothing to settle
	CallbackStale       CallbackOutcome = "stale"        // the step's outcome was known already: nothing changed
	CallbackUnknownStep CallbackOutcome = "unknown_step" // no step has the key: kept for a person
	CallbackDuplicate   CallbackOutcome = "duplicate"    // the event was received before: nothing changed
)

// CallbackResult is what Callback did, and why.
type CallbackResult struct {
	Outcome     CallbackOutcome `json:"outcome"`
	OperationID int64           `json:"operation_id,omitempty"`
	Detail      string          `json:"detail"`
}

const sqlCallbackTakeOver = `
UPDATE operations
   SET status = CASE WHEN status = 'NEEDS_RECONCILIATION' THEN 'RECOVERING' ELSE status END,
       owner_token = gen_random_uuid(), -- the callback owns it now: the old owner's next write is fenced
       owner_id = $2,
       lease_expires_at = now() + make_interval(secs => $3),
       released = NULL,
       next_attempt_at = NULL,
       updated_at = now()
 WHERE id = $1
   AND status IN ('IN_PROGRESS', 'RECOVERING', 'NEEDS_RECONCILIATION') -- never a finished operation
RETURNING ` + OperationColumns

// Callback receives one callback: see the gates above. When it settles a
// step it runs the operation on like its owner — the local steps in the
// same transaction, then the next call, whose unknown outcome is handed to
// recovery. It returns an error only when nothing was committed.
func (e *Engine) Callback(ctx context.Context, cb Callback) (CallbackResult, error) {
	var (
		res  CallbackResult
		r    *runner
		next *pending
	)
	said := fmt.Sprintf("the %s called back: %s", cb.System, cb.Truth)
	if cb.Reason != "" {
		said += " (" + cb.Reason + ")"
	}
	said += fmt.Sprintf(" — event %s, delivery attempt %d", cb.EventID, cb.Attempt)
	actor := "callback from " + cb.System
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		res, r, next = CallbackResult{}, nil, nil
		tag, err := tx.Exec(ctx, `
			INSERT INTO webhook_inbox (system, event_id, step_key, status, attempt, outcome)
			VALUES ($1, $2, $3, $4, $5, 'noted')
			ON CONFLICT (system, event_id) DO NOTHING -- received before: that copy had the effect`,
			cb.System, cb.EventID, cb.StepKey, string(cb.Truth), cb.Attempt)
		if err != nil {
			return fmt.Errorf("workflow: callback inbox: %w", err)
		}
		if tag.RowsAffected() == 0 {
			res.Outcome, res.Detail = CallbackDuplicate, "event "+cb.EventID+" was received before: nothing changed"
			_, err := tx.Exec(ctx, `
				UPDATE webhook_inbox
				   SET duplicates = duplicates + 1
				 WHERE system = $1
				   AND event_id = $2`, cb.System, cb.EventID)
			return err
		}
		opID, _ := operationOfKey(cb.StepKey) // 0 for a key we never made: no step has it
		err = tx.QueryRow(ctx, `
			SELECT operation_id
			  FROM operation_steps
			 WHERE operation_id = $2
			   AND step_key = $1
			   AND carried_from_run IS NULL -- the step that sent it, not a retry's copy`, cb.StepKey, opID).Scan(&opID)
		if errors.Is(err, pgx.ErrNoRows) {
			res.Outcome, res.Detail = CallbackUnknownStep, "no step has the key "+cb.StepKey+": kept for a person"
			return e.settleInbox(ctx, tx, cb, res)
		}
		if err != nil {
			return fmt.Errorf("workflow: callback step: %w", err)
		}
		res.OperationID = opID
		// The lock: a concurrent write of the operation's owner commits first,
		// and the read below (a statement of its own) sees what it wrote.
		var requestLive bool
		err = tx.QueryRow(ctx, `
			SELECT status = 'IN_PROGRESS' AND lease_expires_at > `+database.Now(2)+`
			  FROM operations
			 WHERE id = $1
			   FOR UPDATE`, opID, e.cfg.Clock.Arg()).Scan(&requestLive)
		if err != nil {
			return fmt.Errorf("workflow: callback lock: %w", err)
		}
		op, err := e.operation(ctx, tx, opID)
		if err != nil {
			return err
		}
		def, ok := e.defs[op.Type]
		if !ok {
			return fmt.Errorf("workflow: no definition for %q", op.Type)
		}
		i := -1
		for j, s := range op.Steps {
			if s.Key == cb.StepKey {
				i = j
			}
		}
		var rec StepRecord
		if i >= 0 {
			rec = op.Steps[i]
		}
		inFlight := rec.State == StepSent || rec.State == StepUnknown
		switch {
		case i < 0:
			res.Outcome, res.Detail = CallbackStale, said+": a step of an earlier run, nothing changed"
		case !inFlight:
			res.Outcome, res.Detail = CallbackStale, fmt.Sprintf("%s: %s was already %s, nothing changed", said, rec.Name, rec.State)
		case cb.Truth == external.TruthRunning:
			res.Outcome, res.Detail = CallbackNoted, said+": still running, nothing to settle"
		case cb.Truth != external.TruthCompleted && cb.Truth != external.TruthRejected:
			return fmt.Errorf("workflow: callback with truth %q", cb.Truth)
		case op.Status != StatusInProgress && op.Status != StatusRecovering && op.Status != StatusNeedsReconciliation:
			res.Outcome, res.Detail = CallbackStale, fmt.Sprintf("%s: the operation is %s, nothing changed", said, op.Status)
		case requestLive:
			// The request that started the operation is waiting for this
			// call's answer, which says the same within its deadline: the
			// callback steps back (nothing written) and comes again.
			return ErrOwnerBusy
		default:
			res.Outcome, res.Detail = CallbackApplied, said
			r, err = e.takeOverForCallback(ctx, tx, def, op, actor, said)
			if err != nil {
				return err
			}
			reason := "it called back " + string(cb.Truth)
			if next, err = r.learnTruth(ctx, tx, i, cb.Truth, reason, said, r.handOver); err != nil {
				return err
			}
			if err := r.flush(ctx, tx); err != nil {
				return err
			}
			return e.settleInbox(ctx, tx, cb, res)
		}
		step := ""
		if i >= 0 {
			step = rec.Name
		}
		if err := recordEvent(ctx, tx, event{op: op, from: op.Status, actor: actor, branch: BranchCallback, step: step,
			detail: res.Detail}); err != nil {
			return err
		}
		return e.settleInbox(ctx, tx, cb, res)
	})
	if err != nil {
		return CallbackResult{}, err
	}
	if next != nil {
		// The callback owns the operation: it makes the next call as a
		// request would, and an unknown outcome goes to recovery.
		if _, err := r.drive(context.WithoutCancel(ctx), next, r.handOver, Hooks[Operation]{}); err != nil &&
			!errors.Is(err, ErrLeaseLost) {
			e.cfg.Logger.Warn("workflow: run on after a callback", "operation", res.OperationID, "err", err)
		}
	}
	return res, nil
}

// takeOverForCallback makes the callback the owner of op (sqlCallbackTakeOver).
func (e *Engine) takeOverForCallback(ctx context.Context, tx pgx.Tx, def *Definition, op Operation, actor, said string) (*runner, error) {
	args := []any{op.ID, actor, e.cfg.Lease.Seconds()}
	taken, err := ScanOperation(tx.QueryRow(ctx, sqlCallbackTakeOver, args...))
	if err != nil {
		return nil, fmt.Errorf("workflow: callback take over: %w", err)
	}
	taken.Steps = op.Steps
	r := e.runner(def, taken, actor)
	r.branch = BranchCallback
	return r, r.event(ctx, tx, op.Status, "", said+": the callback takes the operation over to record it", "workflow.sqlCallbackTakeOver")
}

// settleInbox writes what the callback did on its inbox row.
func (e *Engine) settleInbox(ctx context.Context, tx pgx.Tx, cb Callback, res CallbackResult) error {
	var opID *int64
	if res.OperationID != 0 {
		opID = &res.OperationID
	}
	_, err := tx.Exec(ctx, `
		UPDATE webhook_inbox
		   SET outcome = $3,
		       operation_id = $4,
		       detail = $5
		 WHERE system = $1
		   AND event_id = $2`, cb.System, cb.EventID, string(res.Outcome), opID, res.Detail)
	if err != nil {
		return fmt.Errorf("workflow: callback inbox: %w", err)
	}
	return nil
}
