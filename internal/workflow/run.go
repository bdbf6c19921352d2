package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/tracing"
)

// This file is how an owner drives an operation forward: the local steps in
// the transaction that reaches them, each external step's SENT before its
// call and its outcome after, every write fenced by the owner token — and
// where it stops when a person asked to cancel (cancelAt; the request that
// marks it is cancel.go's). The request that starts an operation and the
// recovery worker that resumes it run this same code.

// pending is an external step recorded SENT whose call is to be made.
type pending struct {
	index    int
	step     Step
	callID   int64 // its row in operation_calls
	deadline time.Time
	request  json.RawMessage
}

func (r *runner) record(i int) StepRecord { return r.op.Steps[i] }

// crash passes crash point p (and the definition's aliases of it): the
// process dies there when a lab armed it. Unarmed — always, in production —
// it costs one atomic load.
func (r *runner) crash(ctx context.Context, p crash.Point) {
	if r == nil || !r.e.cfg.Crash.Armed() {
		return
	}
	sw := r.e.cfg.Crash
	sw.At(ctx, p)
	for alias, to := range r.def.CrashAliases {
		if to == p {
			sw.At(ctx, alias)
		}
	}
}

// The steps' clock: a step's and an operation's times (sent_at,
// finished_at) are clock_timestamp(), the moment the statement writes them —
// the clock of operation_calls.at and operation_events.at — not now(), the
// start of the transaction: one transaction records a call's answer and
// sends the next step, and with now() both the next step's "sent" and this
// one's "finished" would read earlier than the answer that made them. A
// call's row takes its step's sent_at, and an answer's row its step's
// finished_at, so the operation page's Steps and Calls show the same instants.

// sqlInsertSteps is the statement that lays a run's steps out: a COPY of
// their rows (pgx sends it, from insertStepsColumns), not an INSERT — COPY
// writes the rows of one page in one WAL record, an INSERT one per row:
// five records fewer for a cancellation's six steps. The first step is
// DONE at the moment the start function wrote the intent (the operation's
// updated_at, on the database clock); the others PENDING.
const sqlInsertSteps = `COPY operation_steps (operation_id, run, position, name, step_key, system, state, finished_at, updated_at) FROM STDIN`

var insertStepsColumns = []string{"operation_id", "run", "position", "name", "step_key", "system", "state", "finished_at", "updated_at"}

// insertSteps writes the steps of the operation's run, the first DONE (the
// start function recorded the intent), with the timeline's first event.
func (r *runner) insertSteps(ctx context.Context, tx pgx.Tx) error {
	at := r.op.UpdatedAt // the intent's write: this transaction's
	steps, rows := make([]StepRecord, len(r.def.Steps)), make([][]any, len(r.def.Steps))
	for i, s := range r.def.Steps {
		st := StepRecord{Position: i + 1, Name: s.Name, Key: StepKey(r.op.ID, s.Name, r.op.Run), State: StepPending, UpdatedAt: at}
		if s.Call != nil {
			st.System = ptr(s.Call.System())
		}
		if i == 0 {
			st.State, st.FinishedAt = StepDone, &at
		}
		steps[i] = st
		rows[i] = []any{r.op.ID, r.op.Run, st.Position, st.Name, st.Key, st.System, st.State, st.FinishedAt, st.UpdatedAt}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"operation_steps"}, insertStepsColumns, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("workflow: insert steps: %w", err)
	}
	r.op.Steps = steps
	detail := "requested"
	if r.op.Run > 1 {
		detail = fmt.Sprintf("requested again: run %d, new step keys", r.op.Run)
	}
	return r.event(ctx, tx, "", r.def.Steps[0].Name, detail, "workflow.sqlInsertSteps")
}

// advance runs, in tx, the steps from the first one not DONE: each local
// step, then — when send is true — the SENT of the next external step,
// returned as the call to make. With send false it stops before that
// step and returns it unsent (a person's decision leaves the call to
// recovery). When every step is DONE the operation SUCCEEDS and advance
// returns nil.
func (r *runner) advance(ctx context.Context, tx pgx.Tx, send bool) (*pending, error) {
	marked := -1 // the last local step this call has marked DONE
	for i := r.op.current(); i < len(r.op.Steps); i++ {
		rec := r.record(i)
		st, ok := r.def.step(rec.Name)
		if !ok {
			return nil, fmt.Errorf("workflow: %s has no step %q", r.def.Type, rec.Name)
		}
		if st.Do != nil {
			if i > marked {
				var err error
				marked, err = r.localDone(ctx, tx, i)
				if errors.Is(err, errCancelled) {
					return r.cancelAt(ctx, tx, i)
				}
				if err != nil {
					return nil, err
				}
			}
			detail, err := st.Do(ctx, tx, r.op)
			if err != nil {
				return nil, fmt.Errorf("workflow: step %s: %w", rec.Name, err)
			}
			if err := r.event(ctx, tx, r.op.Status, rec.Name, rec.Name+" done: "+detail, "workflow.sqlStepsDone"); err != nil {
				return nil, err
			}
			r.crash(ctx, crashAfter(rec.Name))
			continue
		}
		if !send {
			return &pending{index: i, step: st}, nil
		}
		p, skippedWhy, err := r.sent(ctx, tx, i, st)
		if errors.Is(err, errCancelled) {
			return r.cancelAt(ctx, tx, i)
		}
		if err != nil {
			return nil, err
		}
		if p != nil {
			return p, nil
		}
		if err := r.event(ctx, tx, r.op.Status, rec.Name, rec.Name+" skipped: "+skippedWhy, "workflow.sqlStepSkipped"); err != nil {
			return nil, err
		}
	}
	if r.op.cancelled() {
		return nil, r.fail(ctx, tx, "cancelled; what had been done elsewhere was undone ("+r.compensationNames()+")")
	}
	return nil, r.succeed(ctx, tx)
}

// localDone marks local step i DONE together with the local steps right
// after it, in one statement: they run in this transaction one after the
// other, whatever happens to one happens to all, so one round trip serves
// them all. (Each Do still runs after its step is written DONE: a Do that
// fails rolls the marks back with it.) It returns the last step marked.
func (r *runner) localDone(ctx context.Context, tx pgx.Tx, i int) (int, error) {
	last, names := i, []string{}
	for j := i; j < len(r.op.Steps); j++ {
		if st, ok := r.def.step(r.record(j).Name); !ok || st.Do == nil {
			break
		}
		last, names = j, append(names, r.record(j).Name)
	}
	n, err := r.writeSteps(ctx, tx, sqlStepsDone, r.op.ID, r.token, r.op.Run, names, r.def.compensation(names[0]))
	if err == nil && n != len(names) {
		err = r.whyNoRows(ctx, tx, fmt.Sprintf("steps %v are not all PENDING", names))
	}
	return last, err
}

// writeSteps runs sql, a write of several steps that returns them, and
// keeps them as written. It returns how many it wrote.
func (r *runner) writeSteps(ctx context.Context, tx pgx.Tx, sql string, args ...any) (int, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("workflow: write steps: %w", err)
	}
	steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) { return scanStep(row) })
	if err != nil {
		return 0, fmt.Errorf("workflow: write steps: %w", err)
	}
	for _, got := range steps {
		for j := range r.op.Steps {
			if r.op.Steps[j].Name == got.Name {
				r.op.Steps[j] = got
			}
		}
	}
	return len(steps), nil
}

// sent records step i SENT — its request (computed the first time), its
// deadline, one more attempt — and the call in operation_calls, before the
// call is made. A step whose Request says Skip is DONE instead (nil, why).
func (r *runner) sent(ctx context.Context, tx pgx.Tx, i int, st Step) (*pending, string, error) {
	rec := r.record(i)
	request := rec.Request
	if request == nil {
		req, err := st.Call.Request(ctx, tx, r.op)
		var skip *skipped
		if errors.As(err, &skip) {
			answer, _ := json.Marshal(map[string]string{"skipped": skip.why})
			return nil, skip.why, r.writeStep(ctx, tx, i, sqlStepSkipped, answer, r.def.compensation(rec.Name))
		}
		if err != nil {
			return nil, "", fmt.Errorf("workflow: step %s: request: %w", rec.Name, err)
		}
		if request, err = json.Marshal(req); err != nil {
			return nil, "", fmt.Errorf("workflow: step %s: encode request: %w", rec.Name, err)
		}
	}
	deadline := st.Call.Deadline()
	var callID int64
	if err := r.writeStepScan(ctx, tx, i, sqlStepSent, []any{&callID}, deadline, request, r.e.cfg.Lease.Seconds(), r.actor,
		r.def.compensation(rec.Name), traceOf(ctx)); err != nil {
		return nil, "", err
	}
	rec = r.record(i)
	// "call N": the step's calls sent under its key (Calls sent on the
	// operation page), not the operation's attempts (recovery's budget).
	detail := fmt.Sprintf("%s sent to %s: key %s, call %d, deadline %s", rec.Name, *rec.System, rec.Key, rec.Attempts,
		deadline.UTC().Format("15:04:05.000"))
	if err := r.event(ctx, tx, r.op.Status, rec.Name, detail, "workflow.sqlStepSent"); err != nil {
		return nil, "", err
	}
	return &pending{index: i, step: st, callID: callID, deadline: deadline, request: request}, "", nil
}

// answer is what one call came back with, as the caller measured it — or
// what a status query settled (why set, no call answered).
type answer struct {
	res  external.Result
	took time.Duration
	why  string
}

// send makes p's call, outside any transaction, with the step's key, the
// stored request and the deadline recorded with SENT.
func (r *runner) send(ctx context.Context, p *pending) answer {
	rec := r.record(p.index)
	start := time.Now()
	res, err := p.step.Call.Send(ctx, Call{Key: rec.Key, Deadline: p.deadline, Request: p.request})
	if err != nil {
		// Nothing was sent; still, only a status query may say what happened.
		res = external.Result{Outcome: external.Unknown, Err: err, Deadline: p.deadline}
	}
	return answer{res: res, took: time.Since(start)}
}

// unknownFunc decides, in the transaction recording it, what an unknown
// outcome means for the operation: a request hands it to recovery, a
// recovery worker backs off or asks a person.
type unknownFunc func(ctx context.Context, tx pgx.Tx, why string) error

// drive makes next's call and records its outcome, and so on until the
// operation stops: finished, refused, or unknown (onUnknown decides). It
// calls hooks.Finish in the transaction where it stops.
func (r *runner) drive(ctx context.Context, next *pending, onUnknown unknownFunc, hooks Hooks[Operation]) (Operation, error) {
	for next != nil {
		r.crash(ctx, crashBefore(next.step.Name))
		got := r.send(ctx, next)
		r.crash(ctx, crashAfter(next.step.Name))
		var following *pending
		err := r.inTx(ctx, func(tx pgx.Tx) error {
			var err error
			if following, err = r.recordAnswer(ctx, tx, next, got, onUnknown); err != nil {
				return err
			}
			if following == nil {
				return hooks.RunFinish(ctx, tx, r.op, nil)
			}
			return nil
		})
		if err != nil {
			return Operation{}, r.fenced(ctx, err)
		}
		next = following
	}
	return r.op, nil
}

// recordAnswer writes, in tx, what p's call came back with: the answer in
// operation_calls, the step DONE, FAILED or UNKNOWN, and what follows —
// the next steps when it is DONE, the refusal's consequence when FAILED,
// onUnknown when UNKNOWN. It returns the next call to make, if any.
func (r *runner) recordAnswer(ctx context.Context, tx pgx.Tx, p *pending, got answer, onUnknown unknownFunc) (*pending, error) {
	if err := r.flushAsked(ctx, tx); err != nil {
		return nil, err
	}
	rec := r.record(p.index)
	res := got.res
	why := got.why
	// The call's answer row, written by the step's own write (one statement);
	// none when a status query settled the outcome (no call answered).
	var call *callAnswer
	if p.callID != 0 {
		why = describeOutcome(*rec.System, res)
		call = &callAnswer{id: p.callID, res: res, why: why, took: got.took}
	}
	switch res.Outcome {
	case external.Confirmed:
		if err := r.finishStep(ctx, tx, p.index, StepDone, external.TruthCompleted, answerJSON(res), why, call); err != nil {
			return nil, err
		}
		if r.branch != "" {
			r.branch = BranchResumed // what follows is the workflow running on, not the decision
		}
		return r.advance(ctx, tx, true)
	case external.Rejected:
		if err := r.finishStep(ctx, tx, p.index, StepFailed, external.TruthRejected, answerJSON(res), why, call); err != nil {
			return nil, err
		}
		return nil, r.refuse(ctx, tx, p.index, why)
	default:
		if err := r.finishStep(ctx, tx, p.index, StepUnknown, res.Truth, answerJSON(res), why, call); err != nil {
			return nil, err
		}
		return nil, onUnknown(ctx, tx, why)
	}
}

// callAnswer is the answer row of one call in operation_calls.
type callAnswer struct {
	id   int64 // the call's row
	res  external.Result
	why  string
	took time.Duration
}

// finishStep records what is now known of external step i: DONE or FAILED
// (finished) or UNKNOWN, the system's truth, the answer — and, when call is
// set, the call's answer row in the same statement.
func (r *runner) finishStep(ctx context.Context, tx pgx.Tx, i int, state string, truth external.Truth, answer json.RawMessage, why string, call *callAnswer) error {
	var (
		callID             *int64
		outcome, callTruth *string
		took               *int64
	)
	if call != nil {
		callID, outcome, callTruth = &call.id, ptr(call.res.Outcome.String()), nullTruth(call.res.Truth)
		took = ptr(call.took.Milliseconds())
	}
	if err := r.writeStep(ctx, tx, i, sqlStepAnswered, state, nullTruth(truth), answer,
		callID, r.actor, outcome, callTruth, why, took); err != nil {
		return err
	}
	rec := r.record(i)
	return r.event(ctx, tx, r.op.Status, rec.Name, fmt.Sprintf("%s %s: %s", rec.Name, state, why), "workflow.sqlStepAnswered")
}

// refuse is what a definite refusal of step i means: FAILED (the earlier
// local steps undone) when nothing done elsewhere stands, a person's
// decision otherwise.
func (r *runner) refuse(ctx context.Context, tx pgx.Tx, i int, why string) error {
	st, _ := r.def.step(r.record(i).Name)
	if st.Refused == Reconcile {
		return r.reconcile(ctx, tx, nil, why+"; what the earlier steps did elsewhere stands, so a person decides")
	}
	return r.undoAndFail(ctx, tx, i, why)
}

// undoAndFail runs the Undo of the steps before step i, latest first, and
// fails the operation with why.
func (r *runner) undoAndFail(ctx context.Context, tx pgx.Tx, i int, why string) error {
	for j := i - 1; j >= 0; j-- { // the first step's Undo too: the intent may hold something (a slot)
		prev, _ := r.def.step(r.record(j).Name)
		if prev.Undo == nil {
			continue
		}
		detail, err := prev.Undo(ctx, tx, r.op)
		if err != nil {
			return fmt.Errorf("workflow: undo %s: %w", prev.Name, err)
		}
		if err := r.event(ctx, tx, r.op.Status, prev.Name, prev.Name+" undone: "+detail, ""); err != nil {
			return err
		}
	}
	return r.fail(ctx, tx, why)
}

// Stopping at a cancel mark (cancel.go tells the whole idea).

// errCancelled is a begin-step write refused by the cancel mark; the
// runner stops there (cancelAt). It never leaves the runner.
var errCancelled = errors.New("workflow: a cancel was requested")

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
			"so it is undone: %s", by, stopped, strings.Join(stands, ", "), r.compensationNames()), "workflow.sqlStepsCancelled"); err != nil {
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
	n, err := r.writeSteps(ctx, tx, sqlStepsCancelled, r.op.ID, r.token, r.op.Run, r.record(i).Position)
	if err == nil && n == 0 {
		err = r.whyNoRows(ctx, tx, "no step left to cancel")
	}
	return err
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

// handOver is a request's answer to an unknown outcome: the operation stays
// IN_PROGRESS — missing information, not a failure — with its lease ended
// now, so the recovery loop claims it at its next pass instead of waiting
// for the lease to run out.
func (r *runner) handOver(ctx context.Context, tx pgx.Tx, why string) error {
	return r.transition(ctx, tx, sqlHandOver, "workflow.sqlHandOver", "outcome unknown, handed to recovery: "+why, why)
}

// The step writes. Each locks the operation row as its owner in the same
// statement (the owner CTE): a writer whose token was replaced matches
// nothing, and a concurrent claim of the operation waits on this row's lock
// until the write commits or rolls back. A lock, not an update: the step
// rows change, the operation row does not, so it gets no new version and
// its nine indexes no new entries (the operation's updated_at moves with
// the operation itself — ownership, lease, status — and each step keeps
// its own).
const ownerCTE = `
WITH owner AS (
    SELECT id
      FROM operations
     WHERE id = $1
       AND owner_token = $2 -- the fence: 0 rows once another worker owns the operation
       AND status IN ('IN_PROGRESS', 'RECOVERING') -- and never a finished one
       FOR UPDATE -- a claim of the operation waits for this write's commit, then finds a new owner
)`

// ownerBegin … ownerBeginEnd is ownerCTE for the writes that begin a
// step: they are also refused once a person asked to cancel the operation
// — the check before each step (cancel.go) — unless the step is a
// compensation (the boolean parameter between the two halves).
const ownerBegin = `
WITH owner AS (
    SELECT id
      FROM operations
     WHERE id = $1
       AND owner_token = $2 -- the fence
       AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND (cancel_requested_at IS NULL OR `
const ownerBeginEnd = `) -- 0 rows: cancelled before this step (true: a compensation)
       FOR UPDATE
)`

// sqlStepsDone marks local steps ($4, names) DONE; $5: compensations.
const sqlStepsDone = ownerBegin + `$5::bool` + ownerBeginEnd + `
UPDATE operation_steps s
   SET state = 'DONE',
       finished_at = (SELECT clock_timestamp()), -- one instant for all: done together, none before an earlier one
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND s.name = ANY($4::text[])
   AND s.state = 'PENDING' -- a step is done once
RETURNING ` + stepColumns

const sqlStepSkipped = ownerBegin + `$6::bool` + ownerBeginEnd + `
UPDATE operation_steps s
   SET state = 'DONE',
       answer = $5,
       finished_at = clock_timestamp(),
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND s.name = $4
   AND s.state = 'PENDING'
RETURNING ` + stepColumns

// SENT locks the operation as its owner like every step write, and makes
// sure the owner's lease covers the call it is about to make: renewed when
// less than half a lease would be left at the call's deadline ($5), else
// left as it is — the row lock alone, which costs nothing when this
// transaction holds it already (the answer before it took it). It records
// the call in operation_calls: one statement, one round trip, and the
// call's row exists exactly when the step was written SENT. $8 is the actor.
const sqlStepSent = `
WITH owner AS (
    SELECT id,
           lease_expires_at < $5::timestamptz + make_interval(secs => $7 / 2) AS short -- at the call's deadline
      FROM operations
     WHERE id = $1
       AND owner_token = $2 -- the fence
       AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND (cancel_requested_at IS NULL OR $9::bool) -- 0 rows: cancelled before this step ($9: a compensation)
       FOR UPDATE
),
renewed AS (
    UPDATE operations o
       SET lease_expires_at = now() + make_interval(secs => $7)
      FROM owner
     WHERE o.id = owner.id
       AND owner.short -- else the lease covers the call: left as it is
),
sent AS (
    UPDATE operation_steps s
       SET state = 'SENT',
           attempts = s.attempts + 1,
           deadline_at = greatest(s.deadline_at, $5), -- the latest deadline of any attempt: see the deadline rule
           sent_at = clock_timestamp(), -- the moment the call is recorded: its row's at, below
           request = coalesce(s.request, $6), -- computed once; every retry sends it verbatim
           traceparent = coalesce($10, s.traceparent), -- the trace of whoever sends it: what recovery continues
           updated_at = now()
      FROM owner
     WHERE s.operation_id = owner.id
       AND s.run = $3
       AND s.name = $4
       AND s.state IN ('PENDING', 'SENT', 'UNKNOWN') -- never a step whose outcome is known
    RETURNING s.*
),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, owner_token, attempt, deadline_at, request, at)
    SELECT operation_id, step_key, 'call', system, $8, $2, attempts, $5, $6, sent_at
      FROM sent -- nothing when the fence refused the step
    RETURNING id
)
SELECT ` + stepColumns + `, recorded.id
  FROM sent, recorded`

// An answer is for a step in flight. The call's answer row ($8 the call,
// then actor, outcome, truth, detail, took_ms) is written by the same
// statement when a call was answered ($8 set), only if the step was.
const sqlStepAnswered = ownerCTE + `,
answered AS (
    UPDATE operation_steps s
       SET state = $5,
           truth = coalesce($6, s.truth),
           answer = $7,
           finished_at = CASE WHEN $5 IN ('DONE', 'FAILED') THEN clock_timestamp() END, -- the answer row's at
           updated_at = now()
      FROM owner
     WHERE s.operation_id = owner.id
       AND s.run = $3
       AND s.name = $4
       AND s.state IN ('SENT', 'UNKNOWN') -- an answer is for a step in flight
    RETURNING s.*
),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, call_id, system, actor, owner_token, outcome, truth, detail, took_ms, at)
    SELECT operation_id, step_key, 'answer', $8, system, $9, $2, $10, $11, $12, $13, coalesce(finished_at, clock_timestamp())
      FROM answered
     WHERE $8::bigint IS NOT NULL -- a status query settled it: no call to answer
)
SELECT ` + stepColumns + `
  FROM answered`

// sqlStepTruth notes what a status query said, while the outcome stays unknown.
const sqlStepTruth = ownerCTE + `
UPDATE operation_steps s
   SET truth = coalesce($5, s.truth),
       updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id
   AND s.run = $3
   AND s.name = $4
   AND s.state IN ('SENT', 'UNKNOWN')
RETURNING ` + stepColumns

// writeStep runs one of the step writes on step i (its arguments after the
// operation, token, run and name) and keeps the step as written. Zero rows
// is ErrLeaseLost when the fence refused it.
func (r *runner) writeStep(ctx context.Context, tx pgx.Tx, i int, sql string, args ...any) error {
	return r.writeStepScan(ctx, tx, i, sql, nil, args...)
}

// writeStepScan is writeStep for a write that returns more than the step:
// those columns, after the step's, go to extra.
func (r *runner) writeStepScan(ctx context.Context, tx pgx.Tx, i int, sql string, extra []any, args ...any) error {
	rec := r.record(i)
	args = append([]any{r.op.ID, r.token, r.op.Run, rec.Name}, args...)
	var got StepRecord
	err := tx.QueryRow(ctx, sql, args...).Scan(append(stepDest(&got), extra...)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return r.whyNoRows(ctx, tx, fmt.Sprintf("step %s is %s", rec.Name, rec.State))
	}
	if err != nil {
		return fmt.Errorf("workflow: write step %s: %w", rec.Name, err)
	}
	r.op.Steps[i] = got
	return nil
}

// whyNoRows tells a fenced write's zero rows apart: the fence (someone else
// owns the operation now: ErrLeaseLost) or a step not in the state the
// write expects (a bug: what describes it).
func (r *runner) whyNoRows(ctx context.Context, tx pgx.Tx, what string) error {
	var owned, cancel bool
	err := tx.QueryRow(ctx, `
		SELECT owner_token IS NOT DISTINCT FROM $2::uuid
		       AND status IN ('IN_PROGRESS', 'RECOVERING'),
		       cancel_requested_at IS NOT NULL
		  FROM operations
		 WHERE id = $1`, r.op.ID, r.token).Scan(&owned, &cancel)
	if err != nil || !owned {
		return ErrLeaseLost
	}
	if cancel {
		return errCancelled // a begin-step write refused by the cancel mark
	}
	return fmt.Errorf("workflow: operation %d: %s, which this write does not expect", r.op.ID, what)
}

// The operation writes, each fenced like the step writes.
const opFence = `
 WHERE id = $1
   AND owner_token = $2 -- the fence: 0 rows means we no longer own it
   AND status IN ('IN_PROGRESS', 'RECOVERING') -- and a finished operation is never overwritten
RETURNING ` + OperationColumns

const sqlSucceed = `
UPDATE operations
   SET status = 'SUCCEEDED',
       released = NULL,
       next_attempt_at = NULL,
       last_error = NULL,
       finished_at = clock_timestamp(), -- after its last step's
       updated_at = now()` + opFence

const sqlFail = `
UPDATE operations
   SET status = 'FAILED',
       released = NULL,
       next_attempt_at = NULL,
       last_error = $3,
       finished_at = clock_timestamp(),
       updated_at = now()` + opFence

const sqlHandOver = `
UPDATE operations
   SET lease_expires_at = now(), -- ended now: the recovery loop may claim it at once
       released = 'handed_over',
       next_attempt_at = NULL,
       attempts = attempts + 1, -- the request's own attempt counts
       last_error = $3,
       updated_at = now()` + opFence

// sqlReconcile gives the operation to a person. $4 is when recovery asks
// the system again (NULL: never — the answer was a definite refusal).
const sqlReconcile = `
UPDATE operations
   SET status = 'NEEDS_RECONCILIATION',
       released = NULL,
       next_attempt_at = $4,
       last_error = $3,
       updated_at = now()` + opFence

func (r *runner) succeed(ctx context.Context, tx pgx.Tx) error {
	return r.transition(ctx, tx, sqlSucceed, "workflow.sqlSucceed", "every step done")
}

func (r *runner) fail(ctx context.Context, tx pgx.Tx, why string) error {
	return r.transition(ctx, tx, sqlFail, "workflow.sqlFail", "failed: "+why, why)
}

// reconcile hands the operation to a person, with why and the timeline as
// evidence. reaskAt is when recovery asks the truth again (nil: never).
func (r *runner) reconcile(ctx context.Context, tx pgx.Tx, reaskAt *time.Time, why string) error {
	return r.transition(ctx, tx, sqlReconcile, "workflow.sqlReconcile", "a person must decide: "+why, why, reaskAt)
}

// transition runs one fenced operation write, sql (arguments after the
// operation and token), and records its event with detail, naming the
// statement by name.
func (r *runner) transition(ctx context.Context, tx pgx.Tx, sql, name, detail string, args ...any) error {
	from := r.op.Status
	args = append([]any{r.op.ID, r.token}, args...)
	op, err := ScanOperation(tx.QueryRow(ctx, sql, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("workflow: update operation %d: %w", r.op.ID, err)
	}
	op.Steps = r.op.Steps
	r.op = op
	return r.event(ctx, tx, from, "", detail, name)
}

// inTx runs f in a transaction of its own and flushes what it noted.
func (r *runner) inTx(ctx context.Context, f func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, r.e.pool, func(tx pgx.Tx) error {
		r.events = r.events[:0] // a transaction starts with nothing noted
		if err := f(tx); err != nil {
			return err
		}
		return r.flush(ctx, tx)
	})
}

// The branches the runner itself writes under, beside recovery's decision
// tree (recover.go), as recorded on the timeline.
const (
	BranchResumed = "resumed" // running on: from a step that had not started, or after a step's outcome was learned
	BranchFenced  = "fenced"  // a refused late write
)

// fenced counts and records a write refused by the fence (ErrLeaseLost):
// the metric, and a timeline line written after the rollback, saying who
// was refused. Other errors pass through.
func (r *runner) fenced(ctx context.Context, err error) error {
	if r == nil || !errors.Is(err, ErrLeaseLost) {
		return err
	}
	r.e.metrics.fenced.WithLabelValues(r.def.Type).Inc()
	// The line says who was refused, at the status the operation has now.
	ctx = context.WithoutCancel(ctx)
	op := r.op
	op.OwnerToken = &r.token
	logErr := r.e.pool.QueryRow(ctx, `SELECT status FROM operations WHERE id = $1`, op.ID).Scan(&op.Status)
	if logErr == nil {
		logErr = recordEvent(ctx, r.e.pool, event{op: op, from: op.Status, actor: r.actor, branch: BranchFenced,
			detail: "a late write was refused: this owner token no longer owns the operation, so nothing it meant to write was written"})
	}
	if logErr != nil {
		r.e.cfg.Logger.Warn("workflow: could not record a fenced write", "operation", r.op.ID, "err", logErr)
	}
	return err
}

// describeOutcome says in a few words what a call's answer means.
func describeOutcome(system string, res external.Result) string {
	switch {
	case res.Outcome == external.Confirmed:
		return system + " confirmed"
	case res.Outcome == external.Rejected:
		return system + " refused: " + res.Reason
	case res.Truth == external.TruthRunning:
		return system + " accepted the call and is still running it"
	case errors.Is(res.Err, external.ErrDeadlinePassed):
		return "not sent: its deadline had passed (" + res.Err.Error() + ")"
	case errors.Is(res.Err, context.DeadlineExceeded):
		return "no answer from " + system + " before the deadline"
	case res.Err != nil:
		return fmt.Sprintf("no usable answer from %s: %v", system, res.Err)
	default:
		return "no answer from " + system
	}
}

// answerJSON is what the step keeps of an answer.
func answerJSON(res external.Result) json.RawMessage {
	a := map[string]any{"outcome": res.Outcome.String()}
	if res.Truth != "" {
		a["truth"] = res.Truth
	}
	if res.Reason != "" {
		a["reason"] = res.Reason
	}
	if res.Err != nil {
		a["error"] = res.Err.Error()
	}
	b, _ := json.Marshal(a)
	return b
}

// traceOf is ctx's trace as a traceparent to store with a step, nil when
// ctx carries none.
func traceOf(ctx context.Context) *string {
	if tp := tracing.Parent(ctx); tp != "" {
		return &tp
	}
	return nil
}
