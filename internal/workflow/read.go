package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// This file reads operations back: one with its steps, the operations of a
// policy or a booking, those in a status. The pages' own reads of the
// timeline, the call log and the callbacks received are
// internal/readmodel's; the desk's are internal/reconciliation's.
// Nothing here writes.

// operation reads operation id with the steps of its current run.
func (e *Engine) operation(ctx context.Context, db database.DBTX, id int64) (Operation, error) {
	op, err := ScanOperation(db.QueryRow(ctx, `SELECT `+OperationColumns+` FROM operations WHERE id = $1`, id))
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

// ListByStatus returns up to limit operations in status, least recently
// updated first (the longest waiting at the top), with their steps.
func (e *Engine) ListByStatus(ctx context.Context, status string, limit int) ([]Operation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+OperationColumns+`
		  FROM operations
		 WHERE status = $1
		 ORDER BY updated_at, id
		 LIMIT $2`, status, limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: list by status: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return ScanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: list by status: %w", err)
	}
	return ops, withSteps(ctx, e.pool, pointers(ops))
}

func pointers[T any](s []T) []*T {
	p := make([]*T, len(s))
	for i := range s {
		p[i] = &s[i]
	}
	return p
}

// BookingOperations returns the operations whose subject is bookingID (the
// deposit saga's booking and cancellation), oldest first, with their steps.
func (e *Engine) BookingOperations(ctx context.Context, bookingID int64) ([]Operation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+OperationColumns+`
		  FROM operations
		 WHERE booking_id = $1
		 ORDER BY id`, bookingID)
	if err != nil {
		return nil, fmt.Errorf("workflow: operations of booking %d: %w", bookingID, err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return ScanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: operations of booking %d: %w", bookingID, err)
	}
	return ops, withSteps(ctx, e.pool, pointers(ops))
}

// Operations returns those of ids that exist, in the order of their ids,
// with their steps.
func (e *Engine) Operations(ctx context.Context, ids []int64) ([]Operation, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+OperationColumns+`
		  FROM operations
		 WHERE id = ANY($1)
		 ORDER BY id`, ids)
	if err != nil {
		return nil, fmt.Errorf("workflow: operations: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return ScanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: operations: %w", err)
	}
	return ops, withSteps(ctx, e.pool, pointers(ops))
}

// Definition returns the definition of the operations of type typ.
func (e *Engine) Definition(typ string) (Definition, bool) {
	def, ok := e.defs[typ]
	if !ok {
		return Definition{}, false
	}
	return *def, true
}

// Step returns the definition of step name of the operations of type typ.
func (e *Engine) Step(typ, name string) (Step, bool) {
	def, ok := e.defs[typ]
	if !ok {
		return Step{}, false
	}
	return def.step(name)
}
