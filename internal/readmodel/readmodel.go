// Package readmodel is what the operation and recovery pages read of the
// workflow engine's tables, beyond the operations themselves (which
// workflow.Engine reads): an operation's timeline and its exchanges with
// other systems, the callbacks received, the counts per status, the live
// operations and the latest recovery steps. Nothing here writes, and
// nothing in the engine depends on it: delete the pages and the engine
// still runs.
package readmodel

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Timeline returns the operation's events, oldest first.
func Timeline(ctx context.Context, db database.DBTX, operationID int64) ([]Event, error) {
	rows, err := db.Query(ctx, `
		SELECT id, operation_id, at, from_status, to_status, actor, owner_token::text, detail, statement, '', branch,
		       step
		  FROM operation_events
		 WHERE operation_id = $1
		 ORDER BY id`, operationID)
	if err != nil {
		return nil, fmt.Errorf("readmodel: timeline: %w", err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
	if err != nil {
		return nil, fmt.Errorf("readmodel: timeline: %w", err)
	}
	for i := range events {
		statementOf(&events[i])
	}
	return events, nil
}

// statementOf fills the text of the statement a timeline line names
// (workflow.Statement). A line written outside the engine — a demo
// control's, a lab's — stores its SQL itself rather than a name: it is
// shown folded like every other, with no name to link (issue 29's second
// read: "written by" followed by raw SQL).
func statementOf(ev *Event) {
	if sql, ok := workflow.Statement(ev.StatementName); ok {
		ev.Statement = sql
		return
	}
	if strings.ContainsAny(strings.TrimSpace(ev.StatementName), " \n\t") {
		ev.Statement, ev.StatementName = strings.TrimSpace(ev.StatementName), ""
	}
}

// Calls returns the operation's exchanges with other systems, oldest first.
func Calls(ctx context.Context, db database.DBTX, operationID int64) ([]CallRecord, error) {
	rows, err := db.Query(ctx, `
		SELECT id, step_key, kind, call_id, system, actor, owner_token::text, at, attempt, deadline_at,
		       request, outcome, truth, detail, took_ms
		  FROM operation_calls
		 WHERE operation_id = $1
		 ORDER BY id`, operationID)
	if err != nil {
		return nil, fmt.Errorf("readmodel: calls: %w", err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CallRecord])
	if err != nil {
		return nil, fmt.Errorf("readmodel: calls: %w", err)
	}
	return calls, nil
}

// CountByStatus counts operations per status (every status present, zeros included).
func CountByStatus(ctx context.Context, db database.DBTX) (map[string]int, error) {
	counts := map[string]int{}
	for _, s := range workflow.Statuses {
		counts[s] = 0
	}
	rows, err := db.Query(ctx, `SELECT status, count(*) FROM operations GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("readmodel: count by status: %w", err)
	}
	var st string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&st, &n}, func() error { counts[st] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("readmodel: count by status: %w", err)
	}
	return counts, nil
}

// LiveOperation is an operation someone is (or should be) working on, as
// the recovery page lists it.
type LiveOperation struct {
	workflow.Operation
	// Stale: its lease is over, so recovery may claim it (once Due).
	Stale bool
	// Due: no backoff holds it back.
	Due bool
}

// ListLive returns the IN_PROGRESS and RECOVERING operations, those whose
// lease ran out longest ago first, judged on the engine's clock.
func ListLive(ctx context.Context, db database.DBTX, e *workflow.Engine, limit int) ([]LiveOperation, error) {
	rows, err := db.Query(ctx, `
		SELECT id,
		       lease_expires_at < `+database.Now(1)+`,
		       next_attempt_at IS NULL OR next_attempt_at <= `+database.Now(1)+`
		  FROM operations
		 WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		 ORDER BY lease_expires_at
		 LIMIT $2`, e.Clock().Arg(), limit)
	if err != nil {
		return nil, fmt.Errorf("readmodel: list live: %w", err)
	}
	live, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (LiveOperation, error) {
		var l LiveOperation
		err := row.Scan(&l.ID, &l.Stale, &l.Due)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("readmodel: list live: %w", err)
	}
	ids := make([]int64, len(live))
	for i, l := range live {
		ids[i] = l.ID
	}
	ops, err := e.Operations(ctx, ids)
	if err != nil {
		return nil, err
	}
	// An operation that finished between the two reads is no longer live.
	out := live[:0]
	for _, l := range live {
		if i, found := slices.BinarySearchFunc(ops, l.ID, func(op workflow.Operation, id int64) int { return cmp.Compare(op.ID, id) }); found {
			l.Operation = ops[i]
			out = append(out, l)
		}
	}
	return out, nil
}

// RecoveryEvent is one recovery step on some operation's timeline, for the
// recovery page: which branch, by which worker, on what subject.
type RecoveryEvent struct {
	Event
	Type     string
	PolicyID int64
	UserID   int64 // whose operation: a page shows another's without its details
}

// RecentRecoveryEvents returns the newest events that carry a branch: the
// lines of the newest commits that wrote one (operation_timeline_branch_idx;
// each such commit has at least one, so limit commits hold limit lines).
func RecentRecoveryEvents(ctx context.Context, db database.DBTX, limit int) ([]RecoveryEvent, error) {
	rows, err := db.Query(ctx, `
		SELECT ev.id, t.operation_id, t.at, ev.from_status, ev.to_status, ev.actor, ev.owner_token::text,
		       ev.detail, ev.statement, ev.branch, ev.step, o.operation_type, coalesce(o.policy_id, 0), o.user_id
		  FROM (SELECT *
		          FROM operation_timeline
		         WHERE branch IS NOT NULL
		         ORDER BY id DESC
		         LIMIT $1) t
		  JOIN operations o ON o.id = t.operation_id,
		       unnest(t.line_ids, t.from_status, t.to_status, t.actor, t.owner_token, t.detail, t.statement, t.branch, t.step)
		           AS ev(id, from_status, to_status, actor, owner_token, detail, statement, branch, step)
		 WHERE ev.branch IS NOT NULL
		 ORDER BY t.id DESC, ev.id DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("readmodel: recent recovery events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RecoveryEvent, error) {
		var r RecoveryEvent
		ev := &r.Event
		err := row.Scan(&ev.ID, &ev.OperationID, &ev.At, &ev.FromStatus, &ev.ToStatus, &ev.Actor, &ev.OwnerToken,
			&ev.Detail, &ev.StatementName, &ev.Branch, &ev.Step, &r.Type, &r.PolicyID, &r.UserID)
		statementOf(ev)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("readmodel: recent recovery events: %w", err)
	}
	return out, nil
}

// Truth asks the system behind external step of op for the truth of the
// step's key, now: what the operation page shows beside what was recorded.
func Truth(ctx context.Context, e *workflow.Engine, op workflow.Operation, step string) (external.Truth, error) {
	st, ok := e.Step(op.Type, step)
	rec, found := op.Step(step)
	if !ok || !found || st.Call == nil {
		return "", fmt.Errorf("readmodel: %s has no external step %q", op.Type, step)
	}
	return st.Call.Status(ctx, rec.Key)
}

// Event is one line of an operation's append-only timeline.
type Event struct {
	ID          int64     `json:"id"`
	OperationID int64     `json:"operation_id"`
	At          time.Time `json:"at"`
	FromStatus  *string   `json:"from_status"`
	ToStatus    string    `json:"to_status"`
	Actor       string    `json:"actor"`
	OwnerToken  *string   `json:"owner_token"`
	Detail      string    `json:"detail"`
	// StatementName names the statement that made the transition,
	// "workflow.sqlStepSent" ("" for none); Statement is its text.
	StatementName string `json:"statement_name,omitempty"`
	Statement     string `json:"statement"`
	// Branch is the recovery decision-tree branch, for recovery events.
	Branch *string `json:"branch,omitempty"`
	// Step is the step the event is about (nil: the operation as a whole).
	Step *string `json:"step,omitempty"`
}

// CallRecord is one line of the log of exchanges with other systems.
type CallRecord struct {
	ID         int64           `json:"id"`
	StepKey    string          `json:"step_key"`
	Kind       string          `json:"kind"` // call | answer | status
	CallID     *int64          `json:"call_id,omitempty"`
	System     string          `json:"system"`
	Actor      string          `json:"actor"`
	OwnerToken *string         `json:"owner_token"`
	At         time.Time       `json:"at"`
	Attempt    *int            `json:"attempt,omitempty"`
	DeadlineAt *time.Time      `json:"deadline_at,omitempty"`
	Request    json.RawMessage `json:"request,omitempty"`
	Outcome    *string         `json:"outcome,omitempty"`
	Truth      *string         `json:"truth,omitempty"`
	Detail     string          `json:"detail"`
	TookMS     *int            `json:"took_ms,omitempty"`
}

// CallbackRecord is one callback received, as the pages list it.
type CallbackRecord struct {
	System      string    `json:"system"`
	EventID     string    `json:"event_id"`
	StepKey     string    `json:"step_key"`
	Status      string    `json:"status"`
	Attempt     int       `json:"attempt"`
	Duplicates  int       `json:"duplicates"`
	ReceivedAt  time.Time `json:"received_at"`
	Outcome     string    `json:"outcome"`
	OperationID *int64    `json:"operation_id"`
	Detail      string    `json:"detail"`
}

// CallbackFilter picks callbacks to list: of one system ("": any), of one
// operation (0: any), only those kept for a person.
type CallbackFilter struct {
	System      string
	OperationID int64
	UnknownOnly bool
	Limit       int // default 50
}

// Callbacks lists the callbacks received, newest first.
func Callbacks(ctx context.Context, db database.DBTX, f CallbackFilter) ([]CallbackRecord, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	rows, err := db.Query(ctx, `
		SELECT system, event_id, step_key, status, attempt, duplicates, received_at, outcome, operation_id, detail
		  FROM webhook_inbox
		 WHERE ($1 = '' OR system = $1)
		   AND ($2 = 0 OR operation_id = $2)
		   AND (NOT $3 OR outcome = 'unknown_step')
		 ORDER BY received_at DESC
		 LIMIT $4`, f.System, f.OperationID, f.UnknownOnly, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("readmodel: callbacks: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CallbackRecord])
	if err != nil {
		return nil, fmt.Errorf("readmodel: callbacks: %w", err)
	}
	return list, nil
}
