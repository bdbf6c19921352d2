// Package invariants checks, with SQL, the promises idemlab makes whatever
// happens — faults, retries, races and crashes (docs/invariants.md):
//
//  1. At most one provider cancellation effect per policy.
//  2. At most one operation per (policy_id, operation_type).
//  3. At most one confirmed booking per slot; a slot is BOOKED exactly when
//     it has one.
//  4. A policy is CANCELLED exactly when its cancellation's mark_cancelled
//     step is DONE — which happens only once the provider says COMPLETED
//     for the provider_cancel step's key; a FAILED cancellation was never
//     applied by the provider.
//  5. A completed idempotency key replays the identical status and body:
//     here, every COMPLETED key holds a whole stored response (replaying it
//     byte for byte is the middleware's job, tested there).
//  6. Once faults stop, every operation reaches a terminal state within
//     recovery's bound (recovery.Bounds) of becoming claimable: here, no
//     live operation has been claimable — its lease ended and its backoff
//     over — for more than Options.StaleAfter.
//  7. At most one refund per policy in the payments ledger; a refund only
//     for a CANCELLED policy; a refund step DONE is one the payments
//     service reports COMPLETED; every cancelled policy has its refund DONE
//     or its operation still waiting (for recovery or for a person); and a
//     SUCCEEDED operation has every step of its run DONE.
//  8. The deposit saga: no slot HELD or BOOKED without a pending or
//     confirmed deposit where its resource needs one; a charge DONE is one
//     the payments service reports COMPLETED; at most one charge and one
//     refund per booking; no refund without its charge; no hold released
//     while its charge is not known not to exist; every FAILED deposit
//     booking left its slot free.
//  11. A cancelled operation ran no step after its cancel mark but the
//     learning of a step already sent and its compensations.
//  10. Steps are never done out of order: no step is DONE while an earlier
//     step of the same run is not, or finished before it. A callback is
//     applied at most once per step, and a step it settled stays settled.
//
// A fake's reset forgets its records: a DONE step sent before the fake's
// last reset (fault.resets) has no record left to compare with, so 4, 7
// and 8 leave it out (Counts.ForgottenByReset) and check the steps sent
// after it.
//
// Check is read-only and cheap enough to call at the end of a load test
// (about 830 ms with 100k rows in every table and six step rows per
// operation, BenchmarkCheck100k): each invariant
// is one query over an index or one pass over its table, and where a
// constraint or unique index already makes a violation impossible (2, one
// half of 3, 5), Check verifies that this guard is in place and valid
// instead of scanning data the database would have refused.
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
	// Keys name offending rows whose identity is not a number (event ids).
	Keys []string `json:"keys,omitempty"`
	// Undelivered: the violation is events not yet applied by every
	// consumer long after they were written. While the broker does not
	// answer that is the outbox keeping them, not a broken promise: the
	// admin pages say so instead (internal/web/banner.go). The API reports
	// it either way — invariant 9 holds once faults stop.
	Undelivered bool `json:"-"`
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
	// ForgottenByReset counts the DONE steps sent to a fake before its last
	// reset: the fake forgot its side of them, so invariants 4, 7 and 8
	// cannot check them against it (and do not call them broken).
	ForgottenByReset int64 `json:"forgotten_by_reset"`
}

// Options tune Check.
type Options struct {
	// StaleAfter is how long a live operation may stay claimable (its
	// lease ended, its backoff over) before invariant 6 counts it as a
	// violation. Zero reports stale
	// operations in Counts only, never as a violation (right while faults
	// are still on).
	StaleAfter time.Duration
	// MaxIDs bounds the ids listed per violation. Default 100.
	MaxIDs int
	// Retention is OPERATIONS_RETENTION: an operation finished longer ago
	// may have been purged with its steps, so a policy CANCELLED before then
	// has no evidence left to check invariant 4 against (its provider
	// effect and refund still count for 1 and 7). Zero: nothing is purged.
	Retention time.Duration
}

// check is one invariant: a query returning the ids of offending rows.
type check struct {
	invariant int
	detail    string
	sql       string
	// guard names the constraint or unique index that makes a violation
	// impossible: while it exists and is valid, PostgreSQL refuses every
	// row that would break the invariant, so scanning the data would only
	// confirm it. Without it (dropped, or never validated) the data is
	// scanned. "" = always scan.
	guard string
}

var checks = []check{
	{1, "more than one provider effect for a policy", `
		SELECT policy_id
		  FROM fake_provider.effects
		 GROUP BY policy_id
		HAVING count(*) > 1`, ""},
	{2, "more than one operation for the same policy and operation type", `
		SELECT policy_id
		  FROM operations
		 WHERE policy_id IS NOT NULL
		 GROUP BY policy_id, operation_type
		HAVING count(*) > 1`, "operations_policy_type_key"},
	{3, "a slot with more than one confirmed booking", `
		SELECT slot_id
		  FROM bookings
		 WHERE status = 'CONFIRMED'
		 GROUP BY slot_id
		HAVING count(*) > 1`, "bookings_one_confirmed_per_slot"},
	// "BOOKED exactly when it has one", from both sides, each over the
	// booked or confirmed rows only (an index each), not every slot.
	{3, "a BOOKED slot not held by a confirmed booking of its own", `
		SELECT s.id
		  FROM slots s
		  LEFT JOIN bookings b ON b.id = s.booking_id
		 WHERE s.status = 'BOOKED'
		   AND (b.id IS NULL OR b.status <> 'CONFIRMED' OR b.slot_id <> s.id)`, ""},
	{3, "a confirmed booking whose slot does not point at it", `
		SELECT b.slot_id
		  FROM bookings b
		  JOIN slots s ON s.id = b.slot_id
		 WHERE b.status = 'CONFIRMED'
		   AND (s.status <> 'BOOKED' OR s.booking_id IS DISTINCT FROM b.id)`, ""},
	{4, "a provider_cancel DONE that the provider does not report COMPLETED", `
		SELECT s.operation_id
		  FROM operation_steps s
		  LEFT JOIN fake_provider.requests r ON r.idempotency_key = s.step_key
		 WHERE s.name = 'provider_cancel'
		   AND s.state = 'DONE'
		   AND ` + notDecidedByAPerson + `
		   AND (r.idempotency_key IS NULL AND ` + sentSinceReset("provider") + `
		        OR r.idempotency_key IS NOT NULL AND fake_provider.truth(r.outcome, r.completes_at, now()) <> 'COMPLETED')`, ""},
	{4, "a FAILED cancellation the provider applied", `
		SELECT o.id
		  FROM operations o
		  JOIN operation_steps s ON s.operation_id = o.id AND s.run = o.run AND s.name = 'provider_cancel'
		  JOIN fake_provider.requests r ON r.idempotency_key = s.step_key
		 WHERE o.status = 'FAILED'
		   AND r.outcome = 'ACCEPTED'`, ""},
	{7, "more than one refund for a policy in the payments ledger", `
		SELECT policy_id
		  FROM fake_payments.ledger
		 WHERE kind = 'refund'
		   AND policy_id IS NOT NULL
		 GROUP BY policy_id
		HAVING count(*) > 1`, ""},
	{7, "a refund for a policy that is not CANCELLED", `
		SELECT l.policy_id
		  FROM fake_payments.ledger l
		  JOIN policies p ON p.id = l.policy_id
		 WHERE l.kind = 'refund'
		   AND p.status <> 'CANCELLED'`, ""},
	{7, "a refund DONE that the payments service does not report COMPLETED", `
		SELECT s.operation_id
		  FROM operation_steps s
		  LEFT JOIN fake_payments.refunds r ON r.idempotency_key = s.step_key
		 WHERE s.name = 'refund'
		   AND s.state = 'DONE'
		   AND NOT coalesce(s.answer ? 'skipped', false) -- nothing was owed: no call was made
		   AND ` + notDecidedByAPerson + `
		   AND (r.idempotency_key IS NULL AND ` + sentSinceReset("payments") + `
		        OR r.idempotency_key IS NOT NULL AND fault.truth(r.outcome, r.completes_at, now()) <> 'COMPLETED')`, ""},
	{7, "a cancelled policy whose refund is neither DONE nor waiting for recovery or a person", `
		SELECT o.id
		  FROM operations o
		  JOIN operation_steps m ON m.operation_id = o.id AND m.run = o.run AND m.name = 'mark_cancelled' AND m.state = 'DONE'
		  JOIN operation_steps r ON r.operation_id = o.id AND r.run = o.run AND r.name = 'refund'
		 WHERE r.state <> 'DONE'
		   AND o.status NOT IN ('IN_PROGRESS', 'RECOVERING', 'NEEDS_RECONCILIATION')`, ""},
	{7, "a SUCCEEDED operation with a step of its run not DONE", `
		SELECT DISTINCT o.id
		  FROM operations o
		  JOIN operation_steps s ON s.operation_id = o.id AND s.run = o.run
		 WHERE o.status = 'SUCCEEDED'
		   AND s.state <> 'DONE'`, ""},
	// The deposit saga (internal/slots/deposit.go, docs/saga.md). A
	// booking's deposit is its BOOK_DEPOSIT operation's charge_deposit step
	// of the current run: DONE is a confirmed deposit, PENDING/SENT/UNKNOWN
	// a pending one.
	{8, "a slot needing a deposit HELD without a pending deposit, or BOOKED without a confirmed one", `
		SELECT s.id
		  FROM slots s
		  LEFT JOIN operations o ON o.booking_id = s.booking_id AND o.operation_type = 'BOOK_DEPOSIT'
		  LEFT JOIN operation_steps c ON c.operation_id = o.id AND c.run = o.run AND c.name = 'charge_deposit'
		 WHERE s.deposit_cents IS NOT NULL
		   AND s.status IN ('HELD', 'BOOKED')
		   AND NOT coalesce(CASE s.status
		                        WHEN 'BOOKED' THEN c.state = 'DONE'
		                        -- charged, then cancelled: held while the refund is under way
		                        ELSE c.state IN ('PENDING', 'SENT', 'UNKNOWN') OR c.state = 'DONE' AND o.cancel_requested_at IS NOT NULL
		                    END, false)`, ""},
	{8, "a charge_deposit DONE that the payments service does not report COMPLETED", `
		SELECT s.operation_id
		  FROM operation_steps s
		  LEFT JOIN fake_payments.charges c ON c.idempotency_key = s.step_key
		 WHERE s.name = 'charge_deposit'
		   AND s.state = 'DONE'
		   AND ` + notDecidedByAPerson + `
		   AND (c.idempotency_key IS NULL AND ` + sentSinceReset("payments") + `
		        OR c.idempotency_key IS NOT NULL AND fault.truth(c.outcome, c.completes_at, now()) <> 'COMPLETED')`, ""},
	{8, "more than one charge (or refund) for a booking in the payments ledger", `
		SELECT booking_id
		  FROM fake_payments.ledger
		 WHERE booking_id IS NOT NULL
		 GROUP BY booking_id, kind
		HAVING count(*) > 1`, ""},
	{8, "a refund of a booking's deposit without its charge", `
		SELECT r.booking_id
		  FROM fake_payments.ledger r
		 WHERE r.kind = 'refund'
		   AND r.booking_id IS NOT NULL
		   AND NOT EXISTS (SELECT 1
		                     FROM fake_payments.ledger c
		                    WHERE c.kind = 'charge'
		                      AND c.idempotency_key = r.charge_key)`, ""},
	// Released while the charge is unknown: a PENDING booking that no
	// longer holds its slot, or a FAILED one whose charge is not known
	// refused or never made — or was made after all.
	{8, "a deposit booking's hold released while its charge was not known not to exist", `
		SELECT b.id
		  FROM bookings b
		  LEFT JOIN slots s ON s.id = b.slot_id AND s.booking_id = b.id AND s.status = 'HELD'
		 WHERE b.status = 'PENDING'
		   AND s.id IS NULL
		UNION ALL
		SELECT b.id
		  FROM bookings b
		  JOIN operations o ON o.booking_id = b.id AND o.operation_type = 'BOOK_DEPOSIT'
		  JOIN operation_steps c ON c.operation_id = o.id AND c.run = o.run AND c.name = 'charge_deposit'
		  LEFT JOIN fake_payments.charges ch ON ch.idempotency_key = c.step_key
		 WHERE b.status = 'FAILED'
		   AND (c.state <> 'FAILED'
		        OR c.truth NOT IN ('REJECTED', 'NOT_STARTED')
		        OR ch.outcome = 'ACCEPTED')`, ""},
	{8, "a FAILED deposit booking that did not leave its slot free", `
		SELECT b.id
		  FROM bookings b
		  JOIN slots s ON s.booking_id = b.id
		 WHERE b.status = 'FAILED'`, ""},
	// One pass over the steps in key order, each beside the one before it:
	// a DONE step right after one not DONE, or finished before it, is out
	// of order (and any disorder shows as such a pair).
	{10, "a step DONE before an earlier step of its run (not done, or finished later)", `
		SELECT DISTINCT operation_id
		  FROM (SELECT operation_id, state, finished_at,
		               lag(state) OVER earlier AS before_state,
		               lag(finished_at) OVER earlier AS before_finished
		          FROM operation_steps
		        WINDOW earlier AS (PARTITION BY operation_id, run ORDER BY position)) s
		 WHERE state = 'DONE'
		   AND (before_state NOT IN ('DONE', 'CANCELLED') OR before_finished > finished_at)`, ""},
	// Cancelling (internal/workflow/cancel.go): after its cancel mark an
	// operation learns the truth of a step already sent and runs its
	// compensations (the steps after a CANCELLED one), nothing else — no
	// call made, no step finished, outside those.
	{11, "a cancelled operation that ran a step after its cancel mark (not a compensation, not a learned truth)", `
		SELECT DISTINCT o.id
		  FROM operations o
		  JOIN operation_steps s ON s.operation_id = o.id AND s.run = o.run
		 WHERE o.cancel_requested_at IS NOT NULL
		   AND NOT EXISTS (SELECT 1
		                     FROM operation_steps x
		                    WHERE x.operation_id = s.operation_id
		                      AND x.run = s.run
		                      AND x.state = 'CANCELLED'
		                      AND x.position < s.position) -- a compensation
		   AND (s.system IS NULL AND s.state = 'DONE' AND s.finished_at > o.cancel_requested_at
		        OR EXISTS (SELECT 1
		                     FROM operation_calls c
		                    WHERE c.operation_id = o.id
		                      AND c.step_key = s.step_key
		                      AND c.kind = 'call'
		                      AND c.at > o.cancel_requested_at))`, ""},
	// Callbacks (issue 28): the inbox's primary key makes one row per event;
	// its effect — settling a step — happens at most once per step, and
	// leaves the step where the callback said, never moved since.
	{10, "a step settled by more than one callback (ids are operations)", `
		SELECT min(operation_id)
		  FROM webhook_inbox
		 WHERE outcome = 'applied'
		 GROUP BY step_key
		HAVING count(*) > 1`, ""},
	{10, "a step a callback settled that is no longer where the callback put it (moved backwards or over)", `
		SELECT w.operation_id
		  FROM webhook_inbox w
		  JOIN operation_steps s ON s.step_key = w.step_key
		 WHERE w.outcome = 'applied'
		   AND s.state <> CASE w.status WHEN 'COMPLETED' THEN 'DONE' ELSE 'FAILED' END`, ""},
	{5, "a COMPLETED idempotency key without a whole stored response (ids are its users)", `
		SELECT user_id
		  FROM idempotency_keys
		 WHERE status = 'COMPLETED'
		   AND (response_status IS NULL OR response_body IS NULL)`, "idempotency_keys_completed_has_response_check"},
}

// sentSinceReset is the condition under which a DONE step s without a
// record at system is a violation: it was sent after the fake's last reset
// (or never sent: a person marked it done). A reset forgets the fake's
// records (fault.resets, migration 00149), so a step sent before it has
// nothing left to be checked against — not a broken promise, and Check
// counts it apart (Counts.ForgottenByReset).
func sentSinceReset(system string) string {
	return `(s.sent_at IS NULL
		             OR s.sent_at > coalesce((SELECT reset_at FROM fault.resets WHERE system = '` + system + `'), '-infinity'))`
}

// notDecidedByAPerson leaves out a step a person marked DONE on the
// reconciliation desk (its answer is the decision: decided_by, decision,
// note): "done by hand" — a refund paid outside the system after payments
// refused it — is the person's word, on the audit trail, and the system
// rightly has no COMPLETED record of it.
const notDecidedByAPerson = `NOT coalesce(s.answer ? 'decided_by', false)`

// staleCheck is invariant 6; its threshold is a parameter.
const staleCheck = `
		SELECT id
		  FROM operations
		 WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		   -- claimable since: its lease ended and any backoff is over (recovery.Bounds)
		   AND greatest(lease_expires_at, next_attempt_at) < now() - make_interval(secs => $1)`

// Check runs every invariant against db and counts what it looked at.
func Check(ctx context.Context, db database.DBTX, opts Options) (Report, error) {
	if opts.MaxIDs <= 0 {
		opts.MaxIDs = 100
	}
	r := Report{OK: true, Violations: []Violation{}}
	guarded, err := validGuards(ctx, db)
	if err != nil {
		return Report{}, fmt.Errorf("invariants: guards: %w", err)
	}
	for _, c := range checks {
		if c.guard != "" && guarded[c.guard] {
			continue // the database itself refuses any row that would break it
		}
		ids, err := collectIDs(ctx, db, c.sql, opts.MaxIDs)
		if err != nil {
			return Report{}, fmt.Errorf("invariants: %d (%s): %w", c.invariant, c.detail, err)
		}
		if len(ids) > 0 {
			r.OK = false
			r.Violations = append(r.Violations, Violation{Invariant: c.invariant, Detail: c.detail, IDs: ids})
		}
	}
	ids, err := collectIDs(ctx, db, cancelledCheck, opts.MaxIDs, opts.Retention.Seconds())
	if err != nil {
		return Report{}, fmt.Errorf("invariants: 4: %w", err)
	}
	if len(ids) > 0 {
		r.OK = false
		r.Violations = append(r.Violations, Violation{Invariant: 4,
			Detail: "a policy CANCELLED without its cancellation's mark_cancelled DONE, or the other way round", IDs: ids})
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
	if err := checkEvents(ctx, db, opts, &r); err != nil {
		return Report{}, err
	}
	r.Counts, err = count(ctx, db)
	return r, err
}

// cancelledCheck is invariant 4 from both sides: the CANCELLED policies and
// the policies whose cancellation (the steps of the operation's current
// run, by name) did mark_cancelled, and whatever is on one side only. $1 is
// Options.Retention in seconds: a policy cancelled before it may have lost
// its operation to the retention janitor — only that side is excused, so an
// operation the janitor has not purged yet still meets its policy.
const cancelledCheck = `
		SELECT coalesce(p.id, m.policy_id)
		  FROM (SELECT id, updated_at
		          FROM policies
		         WHERE status = 'CANCELLED') p
		  FULL JOIN (SELECT o.policy_id
		               FROM operation_steps s
		               JOIN operations o ON o.id = s.operation_id AND o.run = s.run
		              WHERE s.name = 'mark_cancelled'
		                AND s.state = 'DONE'
		                AND o.operation_type = 'CANCEL') m
		    ON m.policy_id = p.id
		 WHERE p.id IS NULL
		    OR (m.policy_id IS NULL
		        -- cancelled before the retention: its operation may be purged
		        AND ($1 = 0 OR p.updated_at >= now() - make_interval(secs => $1)))`

// validGuards returns which of the checks' guards exist and are valid:
// validated constraints, and unique indexes that are valid.
func validGuards(ctx context.Context, db database.DBTX) (map[string]bool, error) {
	var names []string
	for _, c := range checks {
		if c.guard != "" {
			names = append(names, c.guard)
		}
	}
	rows, err := db.Query(ctx, `
		SELECT conname
		  FROM pg_constraint
		 WHERE conname = ANY($1)
		   AND convalidated
		UNION ALL
		SELECT i.relname
		  FROM pg_index x
		  JOIN pg_class i ON i.oid = x.indexrelid
		 WHERE i.relname = ANY($1)
		   AND x.indisunique
		   AND x.indisvalid`, names)
	if err != nil {
		return nil, err
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for _, n := range found {
		m[n] = true
	}
	return m, nil
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
		  FROM operations
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
	// One pass per table.
	err = db.QueryRow(ctx, `
		SELECT b.total, b.confirmed, e.total, o.stale, k.in_progress, k.completed
		  FROM (SELECT count(*) AS total,
		               count(*) FILTER (WHERE status = 'CONFIRMED') AS confirmed
		          FROM bookings) b,
		       (SELECT count(*) AS total FROM fake_provider.effects) e,
		       (SELECT count(*) AS stale
		          FROM operations
		         WHERE status IN ('IN_PROGRESS', 'RECOVERING')
		           AND lease_expires_at < now()) o,
		       (SELECT count(*) FILTER (WHERE status = 'IN_PROGRESS') AS in_progress,
		               count(*) FILTER (WHERE status = 'COMPLETED') AS completed
		          FROM idempotency_keys) k`).
		Scan(&c.Bookings, &c.ConfirmedBookings, &c.Effects, &c.StaleOperations, &c.KeysInProgress, &c.KeysCompleted)
	if err != nil {
		return c, fmt.Errorf("invariants: counts: %w", err)
	}
	err = db.QueryRow(ctx, `
		SELECT count(*)
		  FROM operation_steps s
		  JOIN fault.resets f ON f.system = s.system
		 WHERE s.state = 'DONE'
		   AND s.sent_at <= f.reset_at`).Scan(&c.ForgottenByReset)
	if err != nil {
		return c, fmt.Errorf("invariants: count steps forgotten by a reset: %w", err)
	}
	return c, nil
}
