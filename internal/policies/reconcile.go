package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is what a person does with an operation recovery could not
// finish (NEEDS_RECONCILIATION), and what the recovery and reconciliation
// pages read. A person's decision is not fenced by an owner token — nobody
// owns a NEEDS_RECONCILIATION operation — but it is conditional on the
// state the person saw (status and updated_at): two admins deciding at once
// cannot both win, and nobody decides on a state they never saw.

// Resolution is a person's decision about an operation in reconciliation.
type Resolution string

const (
	// ResolveCancelled: the provider confirms (out of band) that the
	// cancellation happened. SUCCEEDED and policy CANCELLED, in one commit.
	ResolveCancelled Resolution = "mark_cancelled"
	// ResolveRetry: hand the operation back to recovery now, with a fresh
	// budget. Recovery asks the provider first, as always, so this never
	// sends a blind second call.
	ResolveRetry Resolution = "retry"
	// ResolveFailed: the cancellation did not happen and will not; FAILED,
	// the policy stays ACTIVE and may be cancelled again.
	ResolveFailed Resolution = "mark_failed"
)

// Valid reports whether r is one of the three decisions.
func (r Resolution) Valid() bool {
	return r == ResolveCancelled || r == ResolveRetry || r == ResolveFailed
}

// ErrStateChanged: the operation is no longer in the state the person saw —
// usually someone else already resolved it.
var ErrStateChanged = errors.New("policies: the operation changed since it was shown: someone else already resolved it")

// ResolveRequest is one person's decision on one operation, with the state
// they saw when they made it.
type ResolveRequest struct {
	OperationID   int64
	Resolution    Resolution
	SeenUpdatedAt time.Time // the operation's updated_at as shown
	Actor         string    // "admin (request … on app-1)"
	Note          string    // why, in their words (optional)
}

// The three statements share their guard: still NEEDS_RECONCILIATION and
// unchanged since the person looked.
const resolveGuard = `
 WHERE id = $1
   AND status = 'NEEDS_RECONCILIATION'
   AND updated_at = $2 -- 0 rows: it changed since it was shown (someone else resolved it)
RETURNING `

const sqlResolveCancelled = `
UPDATE policy_operations
   SET status = 'SUCCEEDED',
       provider_truth = 'COMPLETED',
       steps = steps || '{"provider_cancel": "DONE", "mark_cancelled": "DONE"}',
       finished_at = now(),
       updated_at = now()` + resolveGuard + opColumns

const sqlResolveRetry = `
UPDATE policy_operations
   SET status = 'IN_PROGRESS',
       owner_token = gen_random_uuid(),
       owner_id = $3,
       lease_expires_at = now(), -- expired at once: the recovery loop claims it at its next pass
       next_attempt_at = now(),
       attempts = 0, -- a fresh budget: a person decided to try again
       updated_at = now()` + resolveGuard + opColumns

const sqlResolveFailed = `
UPDATE policy_operations
   SET status = 'FAILED',
       last_error = $3,
       steps = steps || '{"provider_cancel": "FAILED"}',
       finished_at = now(),
       updated_at = now()` + resolveGuard + opColumns

// Resolve applies a person's decision in one transaction, with its timeline
// event: hooks.Begin first, then the decision, then hooks.Finish with the
// operation — or with the refusal, ErrStateChanged when the operation is not
// as they saw it or ErrOperationNotFound when it does not exist, which
// commits with Begin and is then returned as the error.
func (c *Canceller) Resolve(ctx context.Context, req ResolveRequest, hooks workflow.Hooks[Operation]) (Operation, error) {
	if !req.Resolution.Valid() {
		return Operation{}, fmt.Errorf("policies: unknown resolution %q", req.Resolution)
	}
	var op Operation
	var refusal error
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		var err error
		op, err = resolve(ctx, tx, req)
		switch {
		case errors.Is(err, ErrStateChanged), errors.Is(err, ErrOperationNotFound):
			refusal = err
			return hooks.RunFinish(ctx, tx, Operation{}, err)
		case err != nil:
			return err
		}
		return hooks.RunFinish(ctx, tx, op, nil)
	})
	if err != nil {
		return Operation{}, err
	}
	if refusal != nil {
		return Operation{}, workflow.Refused(refusal)
	}
	return op, nil
}

func resolve(ctx context.Context, tx pgx.Tx, req ResolveRequest) (Operation, error) {
	from := OpNeedsReconciliation
	detail, sql := "", ""
	args := []any{req.OperationID, req.SeenUpdatedAt}
	switch req.Resolution {
	case ResolveCancelled:
		detail, sql = "an admin confirmed with the provider that the cancellation happened: marked cancelled", sqlResolveCancelled
	case ResolveRetry:
		detail, sql = "an admin asked for a retry: handed back to recovery, which asks the provider first", sqlResolveRetry
		args = append(args, req.Actor)
	case ResolveFailed:
		detail, sql = "an admin marked the cancellation failed: the policy stays active", sqlResolveFailed
		args = append(args, "marked failed by an admin: "+orText(req.Note, "no note"))
	}
	if req.Note != "" {
		detail += " — " + req.Note
	}
	op, err := scanOperation(tx.QueryRow(ctx, sql, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := getOperation(ctx, tx, req.OperationID); err != nil {
			return Operation{}, err
		}
		return Operation{}, ErrStateChanged
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: resolve: %w", err)
	}
	statement := sql
	if req.Resolution == ResolveCancelled {
		if _, err := tx.Exec(ctx, sqlMarkPolicyCancelled, op.PolicyID); err != nil {
			return Operation{}, fmt.Errorf("policies: mark policy cancelled: %w", err)
		}
		statement += ";\n" + sqlMarkPolicyCancelled
	}
	return op, recordBranchEvent(ctx, tx, op, &from, req.Actor, BranchResolved, detail, statement)
}

func getOperation(ctx context.Context, tx pgx.Tx, id int64) (Operation, error) {
	op, err := scanOperation(tx.QueryRow(ctx, `SELECT `+opColumns+` FROM policy_operations WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrOperationNotFound
	}
	return op, err
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ListByStatus returns up to limit operations in status, least recently
// updated first (the longest waiting at the top).
func (s *Store) ListByStatus(ctx context.Context, status string, limit int) ([]Operation, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+opColumns+`
		  FROM policy_operations
		 WHERE status = $1
		 ORDER BY updated_at, id
		 LIMIT $2`, status, limit)
	if err != nil {
		return nil, fmt.Errorf("policies: list by status: %w", err)
	}
	defer rows.Close()
	var ops []Operation
	for rows.Next() {
		op, err := scanOperation(rows)
		if err != nil {
			return nil, fmt.Errorf("policies: list by status: %w", err)
		}
		ops = append(ops, op)
	}
	return ops, rows.Err()
}

// CountByStatus counts operations per status (every status present, zeros included).
func (s *Store) CountByStatus(ctx context.Context) (map[string]int, error) {
	counts := map[string]int{OpInProgress: 0, OpRecovering: 0, OpSucceeded: 0, OpFailed: 0, OpNeedsReconciliation: 0}
	rows, err := s.db.Query(ctx, `SELECT status, count(*) FROM policy_operations GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("policies: count by status: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("policies: count by status: %w", err)
		}
		counts[st] = n
	}
	return counts, rows.Err()
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
// lease ran out longest ago first.
func (s *Store) ListLive(ctx context.Context, limit int) ([]LiveOperation, error) {
	rows, err := s.db.Query(ctx, `
		SELECT lease_expires_at < now(),
		       next_attempt_at IS NULL OR next_attempt_at <= now(),
		       `+opColumns+`
		  FROM policy_operations
		 WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		 ORDER BY lease_expires_at
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("policies: list live: %w", err)
	}
	defer rows.Close()
	var live []LiveOperation
	for rows.Next() {
		var l LiveOperation
		var stale, due bool
		op, err := scanOperation(prefixed{rows, []any{&stale, &due}})
		if err != nil {
			return nil, fmt.Errorf("policies: list live: %w", err)
		}
		l.Operation, l.Stale, l.Due = op, stale, due
		live = append(live, l)
	}
	return live, rows.Err()
}

// RecoveryEvent is one recovery step on some operation's timeline, for the
// recovery page: which branch, by which worker.
type RecoveryEvent struct {
	Event
	PolicyID int64
}

// RecentRecoveryEvents returns the newest events that carry a branch.
func (s *Store) RecentRecoveryEvents(ctx context.Context, limit int) ([]RecoveryEvent, error) {
	rows, err := s.db.Query(ctx, `
		SELECT e.id, e.operation_id, e.at, e.from_status, e.to_status, e.actor, e.owner_token::text,
		       e.detail, e.statement, e.branch, o.policy_id
		  FROM operation_events e
		  JOIN policy_operations o ON o.id = e.operation_id
		 WHERE e.branch IS NOT NULL
		 ORDER BY e.id DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("policies: recent recovery events: %w", err)
	}
	defer rows.Close()
	var out []RecoveryEvent
	for rows.Next() {
		var r RecoveryEvent
		e := &r.Event
		if err := rows.Scan(&e.ID, &e.OperationID, &e.At, &e.FromStatus, &e.ToStatus, &e.Actor, &e.OwnerToken,
			&e.Detail, &e.Statement, &e.Branch, &r.PolicyID); err != nil {
			return nil, fmt.Errorf("policies: recent recovery events: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
