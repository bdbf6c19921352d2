package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
)

// This file is what the operation, recovery and reconciliation pages read.
// Nothing here writes.

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
	Statement   string    `json:"statement"`
	// Branch is the recovery decision-tree branch, for recovery events.
	Branch *string `json:"branch,omitempty"`
	// Step is the step the event is about (nil: the operation as a whole).
	Step *string `json:"step,omitempty"`
	// Writer is the function that wrote it, "path/file.go:Func" (nil on
	// lines older than the column); Bound is Statement's values, $1 first.
	Writer *string          `json:"writer,omitempty"`
	Bound  *json.RawMessage `json:"bound,omitempty"`
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

// operation reads operation id with the steps of its current run.
func (e *Engine) operation(ctx context.Context, db database.DBTX, id int64) (Operation, error) {
	op, err := scanOperation(db.QueryRow(ctx, `SELECT `+opColumns+` FROM operations WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("workflow: get operation: %w", err)
	}
	return op, withSteps(ctx, db, []*Operation{&op})
}

// withSteps fills in the steps of each operation's current run.
func withSteps(ctx context.Context, db database.DBTX, ops []*Operation) error {
	if len(ops) == 0 {
		return nil
	}
	ids, runs := make([]int64, len(ops)), make([]int32, len(ops))
	byID := map[int64]*Operation{}
	for i, op := range ops {
		ids[i], runs[i] = op.ID, int32(op.Run)
		op.Steps = []StepRecord{}
		byID[op.ID] = op
	}
	rows, err := db.Query(ctx, `
		SELECT s.operation_id, `+stepColumns+`
		  FROM operation_steps s
		  JOIN unnest($1::bigint[], $2::int[]) AS o(id, run)
		    ON s.operation_id = o.id
		   AND s.run = o.run
		 ORDER BY s.operation_id, s.position`, ids, runs)
	if err != nil {
		return fmt.Errorf("workflow: steps: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var opID int64
		var s StepRecord
		if err := rows.Scan(append([]any{&opID}, stepDest(&s)...)...); err != nil {
			return fmt.Errorf("workflow: steps: %w", err)
		}
		byID[opID].Steps = append(byID[opID].Steps, s)
	}
	return rows.Err()
}

// GetOperation returns operation id, with its steps, if userID may see it
// (its owner, or anyone when asAdmin).
func (e *Engine) GetOperation(ctx context.Context, id, userID int64, asAdmin bool) (Operation, error) {
	op, err := e.operation(ctx, e.pool, id)
	if err != nil {
		return Operation{}, err
	}
	if op.UserID != userID && !asAdmin {
		return Operation{}, ErrNotFound
	}
	return op, nil
}

// OperationOf returns the operation of type typ on policyID, or ErrNotFound.
func (e *Engine) OperationOf(ctx context.Context, typ string, policyID int64) (Operation, error) {
	var id int64
	err := e.pool.QueryRow(ctx, `
		SELECT id
		  FROM operations
		 WHERE policy_id = $1
		   AND operation_type = $2`, policyID, typ).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("workflow: operation of policy %d: %w", policyID, err)
	}
	return e.operation(ctx, e.pool, id)
}

// Timeline returns the operation's events, oldest first.
func (e *Engine) Timeline(ctx context.Context, operationID int64) ([]Event, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT id, operation_id, at, from_status, to_status, actor, owner_token::text, detail, statement, branch, step,
		       writer, bound
		  FROM operation_events
		 WHERE operation_id = $1
		 ORDER BY id`, operationID)
	if err != nil {
		return nil, fmt.Errorf("workflow: timeline: %w", err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
	if err != nil {
		return nil, fmt.Errorf("workflow: timeline: %w", err)
	}
	return events, nil
}

// Calls returns the operation's exchanges with other systems, oldest first.
func (e *Engine) Calls(ctx context.Context, operationID int64) ([]CallRecord, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT id, step_key, kind, call_id, system, actor, owner_token::text, at, attempt, deadline_at,
		       request, outcome, truth, detail, took_ms
		  FROM operation_calls
		 WHERE operation_id = $1
		 ORDER BY id`, operationID)
	if err != nil {
		return nil, fmt.Errorf("workflow: calls: %w", err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CallRecord])
	if err != nil {
		return nil, fmt.Errorf("workflow: calls: %w", err)
	}
	return calls, nil
}

// ListByStatus returns up to limit operations in status, least recently
// updated first (the longest waiting at the top), with their steps.
func (e *Engine) ListByStatus(ctx context.Context, status string, limit int) ([]Operation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+opColumns+`
		  FROM operations
		 WHERE status = $1
		 ORDER BY updated_at, id
		 LIMIT $2`, status, limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: list by status: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return scanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: list by status: %w", err)
	}
	return ops, withSteps(ctx, e.pool, pointers(ops))
}

// CountByStatus counts operations per status (every status present, zeros included).
func (e *Engine) CountByStatus(ctx context.Context) (map[string]int, error) {
	counts := map[string]int{}
	for _, s := range Statuses {
		counts[s] = 0
	}
	rows, err := e.pool.Query(ctx, `SELECT status, count(*) FROM operations GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("workflow: count by status: %w", err)
	}
	var st string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&st, &n}, func() error { counts[st] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("workflow: count by status: %w", err)
	}
	return counts, nil
}

// LiveOperation is an operation someone is (or should be) working on, as
// the recovery page lists it.
type LiveOperation struct {
	Operation
	// Stale: its lease is over, so recovery may claim it (once Due).
	Stale bool
	// Due: no backoff holds it back.
	Due bool
}

// ListLive returns the IN_PROGRESS and RECOVERING operations, those whose
// lease ran out longest ago first, judged on the engine's clock.
func (e *Engine) ListLive(ctx context.Context, limit int) ([]LiveOperation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT lease_expires_at < `+database.Now(1)+`,
		       next_attempt_at IS NULL OR next_attempt_at <= `+database.Now(1)+`,
		       `+opColumns+`
		  FROM operations
		 WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		 ORDER BY lease_expires_at
		 LIMIT $2`, e.cfg.Clock.Arg(), limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: list live: %w", err)
	}
	live, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (LiveOperation, error) {
		var l LiveOperation
		var err error
		l.Operation, err = scanOperation(row, &l.Stale, &l.Due)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: list live: %w", err)
	}
	ops := make([]*Operation, len(live))
	for i := range live {
		ops[i] = &live[i].Operation
	}
	return live, withSteps(ctx, e.pool, ops)
}

// RecoveryEvent is one recovery step on some operation's timeline, for the
// recovery page: which branch, by which worker, on what subject.
type RecoveryEvent struct {
	Event
	Type     string
	PolicyID int64
}

// RecentRecoveryEvents returns the newest events that carry a branch.
func (e *Engine) RecentRecoveryEvents(ctx context.Context, limit int) ([]RecoveryEvent, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT ev.id, ev.operation_id, ev.at, ev.from_status, ev.to_status, ev.actor, ev.owner_token::text,
		       ev.detail, ev.statement, ev.branch, ev.step, o.operation_type, coalesce(o.policy_id, 0)
		  FROM operation_events ev
		  JOIN operations o ON o.id = ev.operation_id
		 WHERE ev.branch IS NOT NULL
		 ORDER BY ev.id DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: recent recovery events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RecoveryEvent, error) {
		var r RecoveryEvent
		ev := &r.Event
		err := row.Scan(&ev.ID, &ev.OperationID, &ev.At, &ev.FromStatus, &ev.ToStatus, &ev.Actor, &ev.OwnerToken,
			&ev.Detail, &ev.Statement, &ev.Branch, &ev.Step, &r.Type, &r.PolicyID)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: recent recovery events: %w", err)
	}
	return out, nil
}

func pointers[T any](s []T) []*T {
	p := make([]*T, len(s))
	for i := range s {
		p[i] = &s[i]
	}
	return p
}

// Truth asks the system behind external step of op for the truth of the
// step's key, now: what the operation page shows beside what was recorded.
func (e *Engine) Truth(ctx context.Context, op Operation, step string) (external.Truth, error) {
	def, ok := e.defs[op.Type]
	if !ok {
		return "", fmt.Errorf("workflow: no definition for %q", op.Type)
	}
	st, ok := def.step(step)
	rec, found := op.Step(step)
	if !ok || !found || st.Call == nil {
		return "", fmt.Errorf("workflow: %s has no external step %q", op.Type, step)
	}
	return st.Call.Status(ctx, rec.Key)
}

// BookingOperations returns the operations whose subject is bookingID (the
// deposit saga's booking and cancellation), oldest first, with their steps.
func (e *Engine) BookingOperations(ctx context.Context, bookingID int64) ([]Operation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+opColumns+`
		  FROM operations
		 WHERE booking_id = $1
		 ORDER BY id`, bookingID)
	if err != nil {
		return nil, fmt.Errorf("workflow: operations of booking %d: %w", bookingID, err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return scanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: operations of booking %d: %w", bookingID, err)
	}
	return ops, withSteps(ctx, e.pool, pointers(ops))
}
