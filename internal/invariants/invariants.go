// Package invariants checks, with SQL, the promises idemlab makes whatever
// happens — faults, retries, races and crashes (DESIGN.md, "Invariants"):
//
//  1. At most one provider cancellation effect per policy.
//  2. At most one operation per (policy_id, operation_type).
//  3. At most one confirmed booking per slot; a slot is BOOKED exactly when
//     it has one.
//  4. A policy is CANCELLED exactly when its cancellation SUCCEEDED and the
//     provider says COMPLETED.
//  5. A completed idempotency key replays the identical status and body:
//     here, every COMPLETED key holds a whole stored response (replaying it
//     byte for byte is the middleware's job, tested there).
//  6. Once faults stop, every operation reaches a terminal state within
//     lease + recovery interval + bounded polling: here, no live operation's
//     lease ran out more than Options.StaleAfter ago.
//
// Check is read-only and cheap enough to call during a load test: each
// invariant is one query over an index or one pass over its table.
package invariants

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Violation is one broken invariant and the rows that break it.
type Violation struct {
	Invariant int     `json:"invariant"`
	Detail    string  `json:"detail"`
	IDs       []int64 `json:"ids"`
}

// Report is the answer of GET /api/v1/invariants.
type Report struct {
	OK         bool        `json:"ok"`
	Violations []Violation `json:"violations"`
	Counts     Counts      `json:"counts"`
}

// Counts describe the data the invariants were checked over.
type Counts struct {
	OperationsByStatus map[string]int64 `json:"operations_by_status"`
	Bookings           int64            `json:"bookings"`
	ConfirmedBookings  int64            `json:"confirmed_bookings"`
	Effects            int64            `json:"effects"`
	StaleOperations    int64            `json:"stale_operations"`
	KeysInProgress     int64            `json:"keys_in_progress"`
	KeysCompleted      int64            `json:"keys_completed"`
}

// Options tune Check.
type Options struct {
	// StaleAfter is how long past its lease a live operation may stay
	// before invariant 6 counts it as a violation. Zero reports stale
	// operations in Counts only, never as a violation (right while faults
	// are still on).
	StaleAfter time.Duration
	// MaxIDs bounds the ids listed per violation. Default 100.
	MaxIDs int
}

// check is one invariant: a query returning the ids of offending rows.
type check struct {
	invariant int
	detail    string
	sql       string
}

var checks = []check{
	{1, "more than one provider effect for a policy", `
		SELECT policy_id
		  FROM fake_provider.effects
		 GROUP BY policy_id
		HAVING count(*) > 1`},
	{2, "more than one operation for the same policy and operation type", `
		SELECT policy_id
		  FROM policy_operations
		 GROUP BY policy_id, operation_type
		HAVING count(*) > 1`},
	{3, "a slot with more than one confirmed booking", `
		SELECT slot_id
		  FROM bookings
		 WHERE status = 'CONFIRMED'
		 GROUP BY slot_id
		HAVING count(*) > 1`},
	{3, "a slot whose status disagrees with its confirmed booking", `
		SELECT s.id
		  FROM slots s
		  LEFT JOIN bookings b ON b.slot_id = s.id AND b.status = 'CONFIRMED'
		 WHERE (s.status = 'BOOKED') <> (b.id IS NOT NULL)
		    OR (b.id IS NOT NULL AND s.booking_id IS DISTINCT FROM b.id)`},
	{4, "a CANCELLED policy without a SUCCEEDED cancellation", `
		SELECT p.id
		  FROM policies p
		  LEFT JOIN policy_operations o
		    ON o.policy_id = p.id AND o.operation_type = 'CANCEL' AND o.status = 'SUCCEEDED'
		 WHERE p.status = 'CANCELLED'
		   AND o.id IS NULL`},
	{4, "a SUCCEEDED cancellation whose policy is not CANCELLED", `
		SELECT o.id
		  FROM policy_operations o
		  JOIN policies p ON p.id = o.policy_id
		 WHERE o.operation_type = 'CANCEL'
		   AND o.status = 'SUCCEEDED'
		   AND p.status <> 'CANCELLED'`},
	{4, "a SUCCEEDED cancellation the provider does not report COMPLETED", `
		SELECT o.id
		  FROM policy_operations o
		  LEFT JOIN fake_provider.requests r ON r.idempotency_key = o.provider_key
		 WHERE o.status = 'SUCCEEDED'
		   AND (r.idempotency_key IS NULL
		        OR fake_provider.truth(r.outcome, r.completes_at, now()) <> 'COMPLETED')`},
	{4, "a FAILED cancellation the provider applied", `
		SELECT o.id
		  FROM policy_operations o
		  JOIN fake_provider.requests r ON r.idempotency_key = o.provider_key
		 WHERE o.status = 'FAILED'
		   AND r.outcome = 'ACCEPTED'`},
	{5, "a COMPLETED idempotency key without a whole stored response (ids are its users)", `
		SELECT user_id
		  FROM idempotency_keys
		 WHERE status = 'COMPLETED'
		   AND (response_status IS NULL OR response_body IS NULL)`},
}

// staleCheck is invariant 6; its threshold is a parameter.
const staleCheck = `
		SELECT id
		  FROM policy_operations
		 WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		   AND lease_expires_at < now() - make_interval(secs => $1)`

// Check runs every invariant against db and counts what it looked at.
func Check(ctx context.Context, db database.DBTX, opts Options) (Report, error) {
	if opts.MaxIDs <= 0 {
		opts.MaxIDs = 100
	}
	r := Report{OK: true, Violations: []Violation{}}
	for _, c := range checks {
		ids, err := collectIDs(ctx, db, c.sql, opts.MaxIDs)
		if err != nil {
			return Report{}, fmt.Errorf("invariants: %d (%s): %w", c.invariant, c.detail, err)
		}
		if len(ids) > 0 {
			r.OK = false
			r.Violations = append(r.Violations, Violation{Invariant: c.invariant, Detail: c.detail, IDs: ids})
		}
	}
	if opts.StaleAfter > 0 {
		ids, err := collectIDs(ctx, db, staleCheck, opts.MaxIDs, opts.StaleAfter.Seconds())
		if err != nil {
			return Report{}, fmt.Errorf("invariants: 6: %w", err)
		}
		if len(ids) > 0 {
			r.OK = false
			r.Violations = append(r.Violations, Violation{Invariant: 6,
				Detail: fmt.Sprintf("an operation still live more than %s after its lease ran out", opts.StaleAfter), IDs: ids})
		}
	}
	var err error
	r.Counts, err = count(ctx, db)
	return r, err
}

func collectIDs(ctx context.Context, db database.DBTX, sql string, limit int, args ...any) ([]int64, error) {
	rows, err := db.Query(ctx, sql+fmt.Sprintf("\n LIMIT %d", limit), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

func count(ctx context.Context, db database.DBTX) (Counts, error) {
	c := Counts{OperationsByStatus: map[string]int64{}}
	rows, err := db.Query(ctx, `
		SELECT status, count(*)
		  FROM policy_operations
		 GROUP BY status`)
	if err != nil {
		return c, fmt.Errorf("invariants: count operations: %w", err)
	}
	var status string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error {
		c.OperationsByStatus[status] = n
		return nil
	}); err != nil {
		return c, fmt.Errorf("invariants: count operations: %w", err)
	}
	err = db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM bookings),
		       (SELECT count(*) FROM bookings WHERE status = 'CONFIRMED'),
		       (SELECT count(*) FROM fake_provider.effects),
		       (SELECT count(*) FROM policy_operations
		         WHERE status IN ('IN_PROGRESS', 'RECOVERING') AND lease_expires_at < now()),
		       (SELECT count(*) FROM idempotency_keys WHERE status = 'IN_PROGRESS'),
		       (SELECT count(*) FROM idempotency_keys WHERE status = 'COMPLETED')`).
		Scan(&c.Bookings, &c.ConfirmedBookings, &c.Effects, &c.StaleOperations, &c.KeysInProgress, &c.KeysCompleted)
	if err != nil {
		return c, fmt.Errorf("invariants: counts: %w", err)
	}
	return c, nil
}
