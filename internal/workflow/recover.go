package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/pause"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/tracing"
)

// The branches of the decision tree, as recorded on the timeline (column
// operation_events.branch) and shown on the recovery page; BranchResumed,
// running on, is the runner's (run.go).
const (
	BranchClaimed        = "claimed"           // a recovery worker took the operation over
	BranchCompleted      = "completed"         // the system says COMPLETED: finish the step locally
	BranchRejected       = "rejected"          // the system says REJECTED: the step FAILED
	BranchNotStarted     = "not_started"       // NOT_STARTED and every deadline passed: the same call again, same key
	BranchNotStartedWait = "not_started_wait"  // NOT_STARTED, but an earlier call may still be on its way: wait
	BranchAbandoned      = "abandoned"         // NOT_STARTED, conclusive, and the step's Abandon says it is no longer wanted: FAILED, earlier steps undone
	BranchPoll           = "poll"              // RUNNING or unreachable: wait, renew the lease, ask again
	BranchRetryUnknown   = "retry_unknown"     // still unknown, the system believed idempotent: the same call again
	BranchBackoff        = "backoff"           // the attempt learned nothing: try again later
	BranchReconciliation = "reconciliation"    // a person decides
	BranchReasked        = "reasked"           // waiting for a person, asked again: the truth is known now
	BranchResolved       = "resolved_by_admin" // a person decided (decide.go)
)

// Recover is the recovery loop's Recoverer for every registered workflow.
// It resumes the claimed operation at its first step not DONE:
//
//	a local step, or an external one never sent → run on from it
//	an external step SENT or UNKNOWN → ask its system for the truth of its key:
//	  COMPLETED   → the step is DONE; run on (through the request's code path)
//	  REJECTED    → the step FAILED: the operation fails, or a person decides
//	  NOT_STARTED → conclusive only once the deadline of every earlier attempt
//	                (plus b.ClockSkew) has passed: then the same call, same key
//	                (out of attempts: a person decides — a send is an attempt —
//	                and each re-ask that finds it NOT_STARTED sends it once more);
//	                before that a call may still be on its way — wait
//	  RUNNING, or the system cannot be asked →
//	      poll: renew the lease (fenced), wait (doubling), ask again — at most b.MaxPolls
//	      still RUNNING → back off and ask later
//	      unreachable → the system believed idempotent: the same call again;
//	                    otherwise back off and ask later (never a blind retry)
//	  out of attempts → the status query just made was the last: a person decides
//
// An operation waiting for a person is asked again when due (c.From
// NEEDS_RECONCILIATION); a conclusive truth takes it back and finishes it.
// Every write is fenced by c.Token. Losing the lease ends the attempt with
// OutcomeFenced and nothing written: the new owner decides.
func (e *Engine) Recover(ctx context.Context, c recovery.Claim, b recovery.Budget) (recovery.Result, error) {
	def, ok := e.defs[c.Type]
	if !ok {
		return recovery.Result{}, fmt.Errorf("workflow: no definition for %q", c.Type)
	}
	op, ok := c.Seen.(Operation) // read by the claim, steps and all
	if !ok {
		var err error
		if op, err = e.operation(ctx, e.pool, c.ID); err != nil {
			return recovery.Result{}, err
		}
	}
	// Recovery continues the trace of whoever sent a step last: the
	// request's, or an earlier recovery's.
	ctx, span := tracing.Start(ctx, "recover operation "+strconv.FormatInt(c.ID, 10), op.lastTrace())
	defer span.End()
	r := e.runner(def, op, c.Actor)
	r.token = c.Token
	a := &attempt{r: r, claim: c, budget: b}
	var res recovery.Result
	var err error
	if c.From == StatusNeedsReconciliation {
		res, err = a.reask(ctx)
	} else {
		res, err = a.resume(ctx)
	}
	res.Polls = a.polls
	if errors.Is(err, ErrLeaseLost) {
		return recovery.Result{Outcome: recovery.OutcomeFenced, Branch: res.Branch, Polls: a.polls}, nil
	}
	return res, err
}

// attempt is one recovery attempt of one operation by one claimer.
type attempt struct {
	r      *runner
	claim  recovery.Claim
	budget recovery.Budget
	polls  int
	asked  int // status queries this attempt: the first question, then each poll's (the Calls table's rows)
	// the last status query's answer
	truth  external.Truth
	askErr error
	// resending: this attempt is a re-ask's one send to an operation out of
	// attempts; unanswered, it goes back to the person (see reask).
	resending bool
}

func (a *attempt) resume(ctx context.Context) (recovery.Result, error) {
	op := a.r.op
	i := op.current()
	if i == len(op.Steps) {
		return a.finishRun(ctx, BranchResumed, "every step was done")
	}
	rec := op.Steps[i]
	switch {
	case rec.State == StepPending:
		return a.finishRun(ctx, BranchResumed, "resumed at "+rec.Name+", which had not started")
	case rec.External() && (rec.State == StepSent || rec.State == StepUnknown):
		return a.decide(ctx, i)
	default:
		return a.handToPerson(ctx, fmt.Sprintf("step %s is %s while the operation is live", rec.Name, rec.State))
	}
}

// decide runs the decision tree on external step i.
func (a *attempt) decide(ctx context.Context, i int) (recovery.Result, error) {
	rec := a.r.record(i)
	system := *rec.System
	for {
		a.ask(ctx, i)
		if a.askErr == nil {
			switch a.truth {
			case external.TruthCompleted:
				return a.learned(ctx, i, BranchCompleted, system+" says COMPLETED: finished locally, no second call")
			case external.TruthRejected:
				return a.learned(ctx, i, BranchRejected, system+" says REJECTED: nothing was applied")
			case external.TruthNotStarted:
				wait, err := a.untilConclusive(ctx, i)
				if err != nil {
					return recovery.Result{}, err
				}
				if wait <= 0 {
					return a.notStarted(ctx, i, fmt.Sprintf("%s has no record of %s and every earlier attempt's deadline "+
						"(+%s for clock skew) has passed, so none can still arrive", system, rec.Key, a.budget.ClockSkew))
				}
				why := fmt.Sprintf("%s has no record of %s yet, but an earlier attempt may still be on its way "+
					"(a status answer describes the past, not the requests still in flight) until its deadline +%s for clock skew, %s from now",
					system, rec.Key, a.budget.ClockSkew, wait.Round(time.Millisecond))
				if wait > a.budget.Lease/2 {
					return a.backOff(ctx, i, BranchNotStartedWait, why+": asking again then", wait, false)
				}
				if err := a.renew(ctx, i, BranchNotStartedWait, why+": lease renewed, asking again then", wait); err != nil {
					return recovery.Result{Branch: BranchNotStartedWait}, err
				}
				if !pause.For(ctx, wait) {
					return recovery.Result{Branch: BranchNotStartedWait}, ctx.Err()
				}
				continue
			}
		}
		if a.r.op.Attempts >= a.budget.MaxAttempts {
			// The status query just made was the last one.
			return a.handToPerson(ctx, fmt.Sprintf("%s after %d attempts (of %d); last status query: %s",
				rec.Name, a.r.op.Attempts, a.budget.MaxAttempts, a.seen(system)))
		}
		if a.polls == a.budget.MaxPolls {
			break
		}
		a.polls++
		wait := a.budget.PollWait(a.polls)
		detail := fmt.Sprintf("poll %d/%d: %s; lease renewed, asking again in %s", a.polls, a.budget.MaxPolls, a.seen(system), wait)
		if err := a.renew(ctx, i, BranchPoll, detail, wait); err != nil {
			return recovery.Result{Branch: BranchPoll}, err
		}
		if !pause.For(ctx, wait) {
			return recovery.Result{Branch: BranchPoll}, ctx.Err()
		}
	}

	// Polling is over and the outcome is still unknown.
	seen := fmt.Sprintf("after %s %s", a.askedText(), a.seen(system))
	if a.askErr == nil { // RUNNING: the system has the call; asking again later is all there is to do
		return a.backOff(ctx, i, BranchBackoff, seen, 0, true)
	}
	b, err := recovery.ReadBelief(ctx, a.r.e.pool, system)
	if err != nil {
		return recovery.Result{}, err
	}
	if b.Idempotent && a.r.op.CancelRequestedAt == nil { // after a cancel, only asking
		return a.resend(ctx, i, BranchRetryUnknown, seen+"; "+b.Says()+", so the same call was sent again")
	}
	return a.backOff(ctx, i, BranchBackoff, seen+"; "+b.Says()+": calling again could apply it twice, so recovery asks again later", 0, true)
}

// ask queries the truth of step i's key; the answer is appended to
// operation_calls with the next write.
func (a *attempt) ask(ctx context.Context, i int) {
	rec := a.r.record(i)
	st, _ := a.r.def.step(rec.Name)
	start := time.Now()
	a.truth, a.askErr = st.Call.Status(ctx, rec.Key)
	a.asked++
	a.r.asked = append(a.r.asked, asked{key: rec.Key, system: *rec.System, truth: a.truth, err: a.askErr, took: time.Since(start)})
}

// askedText counts this attempt's status queries as the Calls table lists
// them: a poll is a question asked again, so the first is not one (third
// read, finding 8: "after 5 polls" beside six status queries).
func (a *attempt) askedText() string {
	if a.asked == a.polls+1 {
		return fmt.Sprintf("%d status queries (the first question, then %d polls)", a.asked, a.polls)
	}
	return fmt.Sprintf("%d status queries (%d of them polls)", a.asked, a.polls)
}

// seen says in words what the last status query told.
func (a *attempt) seen(system string) string {
	if a.askErr != nil {
		return system + " could not be asked (" + a.askErr.Error() + ")"
	}
	return system + " says " + string(a.truth)
}

// untilConclusive is how long until NOT_STARTED for step i is conclusive:
// the latest deadline any attempt carried, plus the clock-skew margin,
// minus now on the database clock. ≤ 0: conclusive now.
func (a *attempt) untilConclusive(ctx context.Context, i int) (time.Duration, error) {
	var secs float64
	err := a.r.e.pool.QueryRow(ctx, `
		SELECT coalesce(extract(epoch FROM deadline_at + make_interval(secs => $2) - `+database.Now(3)+`), 0)
		  FROM operation_steps
		 WHERE operation_id = $4
		   AND step_key = $1
		   AND carried_from_run IS NULL -- the step that sends under the key, not a retry's copy of it`, a.r.record(i).Key, a.budget.ClockSkew.Seconds(), a.r.e.cfg.Clock.Arg(), a.r.op.ID).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("workflow: deadline of %s: %w", a.r.record(i).Key, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// learned records a truth learned by a status query — COMPLETED or
// REJECTED — as step i's outcome, through the code path a call's answer
// takes, and runs on.
func (a *attempt) learned(ctx context.Context, i int, branch, why string) (recovery.Result, error) {
	a.r.branch = branch
	why = "recovery asked: " + why // beside callback.go's "the provider called back: …"
	return a.run(ctx, func(ctx context.Context, tx pgx.Tx) (*pending, error) {
		return a.r.learnTruth(ctx, tx, i, a.truth, "its status says "+string(a.truth), why, a.onUnknown)
	})
}

// learnTruth records in tx a truth learned without a call's answer —
// COMPLETED or REJECTED, told by a status query or by a callback
// (callback.go) — as step i's outcome, through the code path a call's
// answer takes: the fenced step write, which changes the step only while
// it is in flight, then what follows. It returns the next call to make.
func (r *runner) learnTruth(ctx context.Context, tx pgx.Tx, i int, truth external.Truth, reason, why string, onUnknown unknownFunc) (*pending, error) {
	outcome := external.Confirmed
	if truth == external.TruthRejected {
		outcome = external.Rejected
	}
	got := answer{res: external.Result{Outcome: outcome, Truth: truth, Reason: reason}, why: why}
	return r.recordAnswer(ctx, tx, &pending{index: i}, got, onUnknown)
}

// resend makes step i's call again — same key, same request, a new
// deadline — and runs on with its outcome.
func (a *attempt) resend(ctx context.Context, i int, branch, why string) (recovery.Result, error) {
	a.r.branch = branch
	return a.run(ctx, func(ctx context.Context, tx pgx.Tx) (*pending, error) {
		if err := a.r.flushAsked(ctx, tx); err != nil {
			return nil, err
		}
		return a.sendAgain(ctx, tx, i, why, branch == BranchNotStarted)
	})
}

// sendAgain records step i SENT again in tx, with why on the timeline. A
// cancel mark met there is answered by cancelled: the line is taken back.
func (a *attempt) sendAgain(ctx context.Context, tx pgx.Tx, i int, why string, notStarted bool) (*pending, error) {
	name := a.r.record(i).Name
	st, _ := a.r.def.step(name)
	n := len(a.r.events)
	if err := a.r.event(ctx, tx, a.r.op.Status, name, why, ""); err != nil {
		return nil, err
	}
	p, _, err := a.r.sent(ctx, tx, i, st)
	if errors.Is(err, errCancelled) {
		a.r.events = a.r.events[:n] // not sent again after all
		return a.cancelled(ctx, tx, i, notStarted)
	}
	return p, err
}

// cancelled is recovery's answer to a cancel mark met as it was about to
// send step i again: when the step is known never to have taken effect
// (notStarted), the operation stops there like before any step; when its
// outcome is unknown, it is not sent again — that would be a new attempt
// after the cancel — and recovery keeps asking until its truth is known.
func (a *attempt) cancelled(ctx context.Context, tx pgx.Tx, i int, notStarted bool) (*pending, error) {
	if notStarted {
		return a.r.cancelAt(ctx, tx, i)
	}
	a.r.branch = BranchBackoff
	why := "a cancel was requested while " + a.r.record(i).Name + "'s outcome is unknown: not sent again, its truth is asked again later"
	return nil, a.onUnknown(ctx, tx, why)
}

// notStarted acts on a conclusive NOT_STARTED for step i: the call is known
// never to have taken effect. The step's Abandon (if any) decides, in the
// transaction that acts on it, between the same call again (same key) and
// giving the step up — FAILED as if refused, the earlier steps undone.
func (a *attempt) notStarted(ctx context.Context, i int, why string) (recovery.Result, error) {
	st, _ := a.r.def.step(a.r.record(i).Name)
	// Sending again is safe, but it is an attempt: out of attempts, a person
	// decides (their Retry gives a fresh budget), so nothing loops forever.
	outOf := ""
	if a.r.op.Attempts >= a.budget.MaxAttempts && !a.resending {
		outOf = fmt.Sprintf("%s: sending it again would be safe, but recovery has used its %d attempts (of %d), so a person decides (while the system has no record of it, recovery sends it once more at each question)",
			why, a.r.op.Attempts, a.budget.MaxAttempts)
	}
	if st.Abandon == nil {
		if outOf != "" {
			return a.handToPerson(ctx, outOf)
		}
		return a.resend(ctx, i, BranchNotStarted, why+": sent again with the same key")
	}
	return a.run(ctx, func(ctx context.Context, tx pgx.Tx) (*pending, error) {
		if err := a.r.flushAsked(ctx, tx); err != nil {
			return nil, err
		}
		rec := a.r.record(i)
		gaveUp, err := st.Abandon(ctx, tx, a.r.op, a.r.e.cfg.Clock.Arg())
		if err != nil {
			return nil, fmt.Errorf("workflow: step %s: abandon: %w", rec.Name, err)
		}
		if gaveUp == "" && outOf != "" {
			a.r.branch = BranchReconciliation
			reask := a.reaskAt(1)
			return nil, a.r.reconcile(ctx, tx, &reask, outOf)
		}
		if gaveUp == "" {
			a.r.branch = BranchNotStarted
			return a.sendAgain(ctx, tx, i, why+": sent again with the same key", true)
		}
		a.r.branch = BranchAbandoned
		why = why + ", so it is known never to have taken effect; " + gaveUp + ": not sent again"
		answer, _ := json.Marshal(map[string]string{"truth": string(external.TruthNotStarted), "abandoned": gaveUp})
		if err := a.r.finishStep(ctx, tx, i, StepFailed, external.TruthNotStarted, answer, why, nil); err != nil {
			return nil, err
		}
		return nil, a.r.refuse(ctx, tx, i, why)
	})
}

// finishRun runs on from the first step not DONE in one transaction, then
// drives the calls that follow.
func (a *attempt) finishRun(ctx context.Context, branch, why string) (recovery.Result, error) {
	a.r.branch = branch
	return a.run(ctx, func(ctx context.Context, tx pgx.Tx) (*pending, error) {
		if err := a.r.event(ctx, tx, a.r.op.Status, "", why, ""); err != nil {
			return nil, err
		}
		return a.r.advance(ctx, tx, true)
	})
}

// run commits first's writes, drives the calls they lead to, and reports
// how the attempt ended.
func (a *attempt) run(ctx context.Context, first func(ctx context.Context, tx pgx.Tx) (*pending, error)) (recovery.Result, error) {
	var next *pending
	err := a.write(ctx, func(tx pgx.Tx) error {
		var err error
		next, err = first(ctx, tx)
		return err
	})
	if err != nil {
		return recovery.Result{Branch: a.r.branch}, err
	}
	if _, err := a.r.drive(ctx, next, a.onUnknown, Hooks[Operation]{}); err != nil {
		return recovery.Result{Branch: a.r.branch}, err
	}
	return a.result(), nil
}

// onUnknown is recovery's answer to a call whose outcome is unknown: back
// off; the next attempt asks first (and, out of attempts, a person decides).
func (a *attempt) onUnknown(ctx context.Context, tx pgx.Tx, why string) error {
	if a.resending {
		// The re-ask's one send went unanswered too: back to the person,
		// asked again at the top of the ladder — a system that drops every
		// call gets one call per interval, never a loop.
		a.r.branch = BranchReconciliation
		reask := time.Now().Add(a.budget.ReaskMax())
		return a.r.reconcile(ctx, tx, &reask, why+" — the one send of a question while waiting; recovery asks again in "+a.budget.ReaskMax().String())
	}
	attempts := a.r.op.Attempts + 1
	wait := a.budget.BackoffAfter(attempts)
	detail := fmt.Sprintf("%s — attempt %d of %d; asking again in %s", why, attempts, a.budget.MaxAttempts, wait)
	a.r.branch = BranchBackoff
	return a.r.transition(ctx, tx, sqlBackOff, "workflow.sqlBackOff", detail, why, wait.Seconds(), 1)
}

// result is how the attempt ended, read from the operation as written.
func (a *attempt) result() recovery.Result {
	res := recovery.Result{Branch: a.r.branch}
	switch a.r.op.Status {
	case StatusSucceeded:
		res.Outcome = recovery.OutcomeSucceeded
	case StatusFailed:
		res.Outcome = recovery.OutcomeFailed
	case StatusNeedsReconciliation:
		res.Outcome = recovery.OutcomeReconcile
	default:
		res.Outcome = recovery.OutcomeBackedOff
	}
	return res
}

const sqlRenewLease = `
UPDATE operations
   SET lease_expires_at = now() + make_interval(secs => $3), -- covers the next wait and the call after it
       updated_at = now()` + opFence

// renew extends the lease to cover wait and the next call, and notes the
// last status query on the step, before the worker waits.
func (a *attempt) renew(ctx context.Context, i int, branch, detail string, wait time.Duration) error {
	a.r.branch = branch
	return a.noteTruthThen(ctx, i, sqlRenewLease, "workflow.sqlRenewLease", detail, (a.budget.Lease + wait).Seconds())
}

// noteTruthThen writes, in a transaction of its own, the status queries
// made and what the last said of step i (the outcome still unknown), then
// the operation's transition sql, its statement called name.
func (a *attempt) noteTruthThen(ctx context.Context, i int, sql, name, detail string, args ...any) error {
	return a.write(ctx, func(tx pgx.Tx) error {
		if err := a.r.flushAsked(ctx, tx); err != nil {
			return err
		}
		if err := a.r.writeStep(ctx, tx, i, sqlStepTruth, nullTruth(a.truth)); err != nil {
			return err
		}
		return a.r.transition(ctx, tx, sql, name, detail, args...)
	})
}

// sqlBackOff releases the operation until $4 seconds from now; $5 is how
// many attempts this costs (0: waiting for a deadline costs none).
const sqlBackOff = `
UPDATE operations
   SET attempts = attempts + $5,
       next_attempt_at = now() + make_interval(secs => $4), -- no worker claims it before then
       lease_expires_at = now(), -- released: claimable again once next_attempt_at passes
       released = 'backed_off',
       last_error = $3,
       updated_at = now()` + opFence

// backOff ends an attempt that learned nothing: claimable again after wait
// (0: the budget's growing backoff), costing an attempt when counts.
func (a *attempt) backOff(ctx context.Context, i int, branch, why string, wait time.Duration, counts bool) (recovery.Result, error) {
	a.r.branch = branch
	cost, attempts := 0, a.r.op.Attempts
	if counts {
		cost, attempts = 1, attempts+1
	}
	if wait <= 0 {
		wait = a.budget.BackoffAfter(attempts)
	}
	detail := fmt.Sprintf("%s — attempt %d of %d; next attempt in %s", why, attempts, a.budget.MaxAttempts, wait.Round(time.Millisecond))
	if !counts {
		detail = fmt.Sprintf("%s (no attempt used); next look in %s", why, wait.Round(time.Millisecond))
	}
	if err := a.noteTruthThen(ctx, i, sqlBackOff, "workflow.sqlBackOff", detail, why, wait.Seconds(), cost); err != nil {
		return recovery.Result{Branch: branch}, err
	}
	return recovery.Result{Outcome: recovery.OutcomeBackedOff, Branch: branch}, nil
}

// handToPerson sends the operation to reconciliation, right after a status
// query that could not settle it: recovery asks again at the re-ask
// interval, and finishes it itself if the truth becomes known.
func (a *attempt) handToPerson(ctx context.Context, why string) (recovery.Result, error) {
	a.r.branch = BranchReconciliation
	reask := a.reaskAt(1)
	err := a.write(ctx, func(tx pgx.Tx) error {
		if err := a.r.flushAsked(ctx, tx); err != nil {
			return err
		}
		return a.r.reconcile(ctx, tx, &reask, why)
	})
	if err != nil {
		return recovery.Result{Branch: BranchReconciliation}, err
	}
	return recovery.Result{Outcome: recovery.OutcomeReconcile, Branch: BranchReconciliation}, nil
}

// reaskAt is when an operation waiting for a person is asked again after
// its n-th question: the re-ask interval, doubling, capped.
func (a *attempt) reaskAt(n int) time.Time {
	return time.Now().Add(a.budget.ReaskAfter(n))
}

// write runs f in a transaction of its own; a fenced write is counted.
func (a *attempt) write(ctx context.Context, f func(tx pgx.Tx) error) error {
	return a.r.fenced(ctx, a.r.inTx(ctx, f))
}

// reask is the periodic question to an operation waiting for a person: ask
// the truth of its stuck step. Conclusive → take the operation back from
// reconciliation (only if nobody decided meanwhile) and finish it as
// recovery would have. Not conclusive → it keeps waiting, asked again
// later; nothing a person is looking at changes.
func (a *attempt) reask(ctx context.Context) (recovery.Result, error) {
	op := a.r.op
	i := op.current()
	if i == len(op.Steps) || !op.Steps[i].External() || (op.Steps[i].State != StepSent && op.Steps[i].State != StepUnknown) {
		return recovery.Result{Outcome: recovery.OutcomeReasked}, a.r.e.stopReasking(ctx, op.ID)
	}
	rec := op.Steps[i]
	a.ask(ctx, i)
	conclusive := a.askErr == nil && (a.truth == external.TruthCompleted || a.truth == external.TruthRejected)
	if a.askErr == nil && a.truth == external.TruthNotStarted {
		wait, err := a.untilConclusive(ctx, i)
		if err != nil {
			return recovery.Result{}, err
		}
		conclusive = wait <= 0
		// Out of attempts, a NOT_STARTED is taken back for one send (same
		// key, safe): a system that has come back finishes the work without
		// a person; one that still drops the call returns it to them.
		a.resending = conclusive && op.Attempts >= a.budget.MaxAttempts
	}
	if !conclusive {
		return recovery.Result{Outcome: recovery.OutcomeReasked, Branch: BranchReasked}, a.stillWaiting(ctx)
	}
	why := fmt.Sprintf("asked again while waiting for a person: %s — recovery finishes it, no decision needed", a.seen(*rec.System))
	if a.resending {
		why = fmt.Sprintf("asked again while waiting for a person: %s — recovery sends it once more (safe: it never took effect); unanswered, it comes back to the person", a.seen(*rec.System))
	}
	taken, err := a.takeBack(ctx, why)
	if err != nil || !taken {
		return recovery.Result{Outcome: recovery.OutcomeReasked, Branch: BranchReasked}, err
	}
	if a.truth == external.TruthNotStarted {
		return a.notStarted(ctx, i, fmt.Sprintf("%s has no record of %s and every deadline has passed", *rec.System, rec.Key))
	}
	return a.learned(ctx, i, BranchReasked, a.seen(*rec.System))
}

const sqlTakeBack = `
UPDATE operations
   SET status = 'RECOVERING',
       owner_token = gen_random_uuid(), -- the reasking worker becomes the owner
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       released = NULL,
       next_attempt_at = NULL,
       updated_at = now()
 WHERE id = $1
   AND status = 'NEEDS_RECONCILIATION'
   AND updated_at = $2 -- 0 rows: a person decided meanwhile, and the decision stands
RETURNING ` + OperationColumns

// takeBack makes the reasking worker the owner of the operation, unless a
// person decided since it was claimed.
func (a *attempt) takeBack(ctx context.Context, why string) (bool, error) {
	taken := false
	err := a.r.inTx(ctx, func(tx pgx.Tx) error {
		op, err := ScanOperation(tx.QueryRow(ctx, sqlTakeBack, a.r.op.ID, a.claim.SeenUpdatedAt, a.claim.Actor, a.budget.Lease.Seconds()))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("workflow: take back from reconciliation: %w", err)
		}
		from := a.r.op.Status
		op.Steps = a.r.op.Steps
		a.r.op, a.r.token, a.r.branch, taken = op, *op.OwnerToken, BranchReasked, true
		if err := a.r.flushAsked(ctx, tx); err != nil {
			return err
		}
		return a.r.event(ctx, tx, from, "", why, "workflow.sqlTakeBack")
	})
	return taken, err
}

// stillWaiting records the unanswered question and when the next comes:
// after as long again as the operation has waited for a person (since its
// updated_at, which neither a claim nor a question moves). It changes
// neither the status nor updated_at: a person's open decision form stays
// valid. (Counted from its attempts instead, an operation that came to a
// person after more attempts than the budget — 9 of 5 in a chaos run —
// started its questions far up the ladder: asked after 30 s, then only
// after 5 min, long after its truth was known.)
func (a *attempt) stillWaiting(ctx context.Context) error {
	next := time.Now().Add(a.budget.ReaskAfterWaiting(time.Since(a.r.op.UpdatedAt)))
	return a.r.inTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			UPDATE operations
			   SET next_attempt_at = $2 -- a question while waiting is the re-ask ladder's, not an attempt
			 WHERE id = $1
			   AND status = 'NEEDS_RECONCILIATION' -- a person may have decided meanwhile: then nothing`,
			a.r.op.ID, next)
		return err
	})
}

// stopReasking: nothing about the operation can be asked (a definite
// refusal waits for a person), so recovery stops asking.
func (e *Engine) stopReasking(ctx context.Context, opID int64) error {
	_, err := e.pool.Exec(ctx, `
		UPDATE operations
		   SET next_attempt_at = NULL
		 WHERE id = $1
		   AND status = 'NEEDS_RECONCILIATION'`, opID)
	return err
}
