package invariants_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/testdb"
)

func TestCleanDataHoldsEveryInvariant(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || len(r.Violations) != 0 {
		t.Fatalf("fresh demo data: %+v", r)
	}
}

// Each invariant is broken on purpose, behind the application's back, and
// Check must say which one — a check that cannot fail proves nothing.
func TestEveryBrokenInvariantIsReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		invariant int
		name      string
		sql       string
	}{
		{1, "two effects for one policy", `
			INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
			VALUES ('k1', 1, now()), ('k2', 1, now())`},
		{3, "a booked slot without a booking", `
			ALTER TABLE slots DROP CONSTRAINT slots_booked_has_booking_check;
			UPDATE slots SET status = 'BOOKED' WHERE id = 1`},
		{3, "two confirmed bookings for one slot", `
			DROP INDEX bookings_one_confirmed_per_slot;
			DROP INDEX bookings_one_live_per_slot;
			INSERT INTO bookings (slot_id, user_id) VALUES (1, 1), (1, 2)`},
		{4, "a cancelled policy without an operation", `
			UPDATE policies SET status = 'CANCELLED' WHERE id = 1`},
		{4, "a cancellation done the provider never saw", operation(2, "SUCCEEDED", "now() + interval '1 hour'",
			"DONE", "DONE", "DONE", "DONE", "DONE", "DONE") + `
			UPDATE policies SET status = 'CANCELLED' WHERE id = 2;
			INSERT INTO fake_payments.refunds (idempotency_key, policy_id, amount_cents, outcome, completes_at)
			SELECT step_key, 2, 100, 'ACCEPTED', now() - interval '1 second' FROM operation_steps WHERE name = 'refund'`},
		{4, "a failed cancellation the provider applied", operation(3, "FAILED", "NULL", "DONE", "FAILED", "PENDING", "PENDING", "PENDING", "PENDING") + `
			INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
			SELECT step_key, 3, 'ACCEPTED', now() FROM operation_steps WHERE name = 'provider_cancel'`},
		{6, "an operation stuck long after its lease", operation(4, "IN_PROGRESS", "now() - interval '1 hour'",
			"DONE", "SENT", "PENDING", "PENDING", "PENDING", "PENDING")},
		{7, "a succeeded operation with a step not done", operation(4, "SUCCEEDED", "NULL", "DONE", "PENDING", "PENDING", "PENDING", "PENDING", "PENDING")},
		{7, "two refunds for one policy", cancelled(1) + `
			INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, amount_cents, applied_at)
			SELECT 'refund', step_key, 1, 100, now() FROM operation_steps WHERE name = 'refund'
			UNION ALL
			SELECT 'refund', step_key, 1, 100, now() FROM operation_steps WHERE name = 'refund'`},
		{7, "a refund for a policy not cancelled", `
			INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, amount_cents, applied_at)
			VALUES ('refund', 'k', 2, 100, now())`},
		{7, "a refund done the payments service never saw", cancelled(3) + `
			DELETE FROM fake_payments.refunds`},
		{7, "a cancelled policy left without its refund", operation(4, "SUCCEEDED", "NULL", "DONE", "DONE", "DONE", "DONE", "FAILED", "PENDING") + `
			UPDATE policies SET status = 'CANCELLED' WHERE id = 4;
			INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
			SELECT step_key, 4, 'ACCEPTED', now() - interval '1 second' FROM operation_steps WHERE name = 'provider_cancel'`},
		{8, "a deposit slot booked without its deposit", `
			INSERT INTO bookings (id, slot_id, user_id, deposit_cents)
			SELECT 900, id, 1, deposit_cents FROM slots WHERE deposit_cents IS NOT NULL ORDER BY id LIMIT 1;
			UPDATE slots SET status = 'BOOKED', booking_id = 900 WHERE id = (SELECT slot_id FROM bookings WHERE id = 900)`},
		{8, "two charges for one booking", depositBooking("CONFIRMED", "BOOKED", "DONE", "ACCEPTED") + `
			INSERT INTO fake_payments.ledger (kind, idempotency_key, booking_id, amount_cents, applied_at)
			VALUES ('charge', 'k1', 900, 2500, now()), ('charge', 'k2', 900, 2500, now())`},
		{8, "a refund without a charge", `
			INSERT INTO fake_payments.ledger (kind, idempotency_key, booking_id, charge_key, amount_cents, applied_at)
			VALUES ('refund', 'r', 900, 'no-such-charge', 2500, now())`},
		{8, "a hold released while its charge is unknown", depositBooking("FAILED", "AVAILABLE", "UNKNOWN", "ACCEPTED")},
		{8, "a failed deposit booking still holding its slot", depositBooking("FAILED", "HELD", "FAILED", "REJECTED")},
		{10, "a step done before an earlier one", operation(4, "IN_PROGRESS", "now() + interval '1 hour'",
			"DONE", "PENDING", "PENDING", "PENDING", "PENDING", "DONE")},
		{10, "a step finished before the one before it", cancelled(4) + `
			UPDATE operation_steps SET finished_at = now() - interval '1 minute' WHERE name = 'record_intent';
			UPDATE operation_steps SET finished_at = now() - interval '2 minutes' WHERE name <> 'record_intent'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, tc.sql); err != nil {
				t.Fatalf("breaking invariant %d: %v", tc.invariant, err)
			}
			r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if r.OK {
				t.Fatalf("invariant %d broken but report OK: %+v", tc.invariant, r)
			}
			for _, v := range r.Violations {
				if v.Invariant != tc.invariant || len(v.IDs) == 0 {
					t.Errorf("unexpected violation %+v (broke %d)", v, tc.invariant)
				}
			}
		})
	}
}

// Under retention (OPERATIONS_RETENTION) invariant 4 excuses a policy
// cancelled longer ago than the retention for having no operation — the
// janitor may have purged it — and nothing else: a cancelled policy whose
// operation is still there (the janitor runs every minute) holds, and one
// cancelled within the retention without an operation is still caught. A
// load run with a one-minute retention found the first case reported.
func TestCancelledPolicyInvariantUnderRetention(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, cancelled(1)+cancelled(2)+`
		-- 1: cancelled two minutes ago, its operation not purged yet
		UPDATE policies SET updated_at = now() - interval '2 minutes' WHERE id = 1;
		-- 2: cancelled two minutes ago, its operation purged
		UPDATE policies SET updated_at = now() - interval '2 minutes' WHERE id = 2;
		DELETE FROM operation_steps WHERE operation_id = (SELECT id FROM operations WHERE policy_id = 2);
		DELETE FROM operations WHERE policy_id = 2;`); err != nil {
		t.Fatal(err)
	}
	r, err := invariants.Check(ctx, db.Pool, invariants.Options{Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("a cancellation older than the retention, purged or not: %+v", r.Violations)
	}
	// 3: cancelled just now without any operation — not the janitor's doing.
	if _, err := db.Pool.Exec(ctx, `UPDATE policies SET status = 'CANCELLED' WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	r, err = invariants.Check(ctx, db.Pool, invariants.Options{Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK || len(r.Violations) != 1 || r.Violations[0].Invariant != 4 || len(r.Violations[0].IDs) != 1 || r.Violations[0].IDs[0] != 3 {
		t.Fatalf("a policy cancelled within the retention without an operation: %+v", r.Violations)
	}
}

// operation is SQL that makes a cancellation of policy policyID in status,
// its lease until lease (an SQL expression), with its six steps in the
// states given (record_intent, provider_cancel, mark_cancelled,
// publish_event, refund, audit), behind the application's back.
func operation(policyID int, status, lease string, states ...string) string {
	return fmt.Sprintf(`
		INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status, owner_token, lease_expires_at)
		SELECT id, 'CANCEL', user_id, 'k', '%s', gen_random_uuid(), %s FROM policies WHERE id = %d;
		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, deadline_at, sent_at, request, finished_at)
		SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system, s.state,
		       CASE WHEN s.state IN ('SENT', 'UNKNOWN') THEN now() END,
		       CASE WHEN s.state IN ('SENT', 'UNKNOWN') THEN now() END,
		       CASE WHEN s.state IN ('SENT', 'UNKNOWN') THEN '{}'::jsonb END,
		       CASE WHEN s.state IN ('DONE', 'FAILED') THEN now() END
		  FROM operations o,
		       (VALUES (1, 'record_intent', NULL, '%s'), (2, 'provider_cancel', 'provider', '%s'), (3, 'mark_cancelled', NULL, '%s'),
		               (4, 'publish_event', NULL, '%s'), (5, 'refund', 'payments', '%s'), (6, 'audit', NULL, '%s')) AS s(position, name, system, state)
		 WHERE o.policy_id = %d;`, status, lease, policyID, states[0], states[1], states[2], states[3], states[4], states[5], policyID)
}

// depositBooking is SQL for a deposit booking (id 900) of the first deposit
// slot, the booking and the slot in the states given, its BOOK_DEPOSIT
// operation's charge step in chargeState and the payments service's charge
// record with outcome, behind the application's back.
func depositBooking(booking, slot, chargeState, outcome string) string {
	truth := map[string]string{"ACCEPTED": "COMPLETED", "REJECTED": "REJECTED"}[outcome]
	return fmt.Sprintf(`
		INSERT INTO bookings (id, slot_id, user_id, status, deposit_cents)
		SELECT 900, id, 1, '%[1]s', deposit_cents FROM slots WHERE deposit_cents IS NOT NULL ORDER BY id LIMIT 1;
		UPDATE slots SET status = '%[2]s',
		       booking_id = CASE WHEN '%[2]s' = 'AVAILABLE' THEN NULL ELSE 900 END,
		       held_until = CASE WHEN '%[2]s' = 'HELD' THEN now() END
		 WHERE id = (SELECT slot_id FROM bookings WHERE id = 900);
		INSERT INTO operations (booking_id, operation_type, user_id, idempotency_key, status)
		VALUES (900, 'BOOK_DEPOSIT', 1, 'k', 'FAILED');
		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, deadline_at, sent_at, request, finished_at, truth)
		SELECT id, 1, 2, 'charge_deposit', id || ':charge_deposit', 'payments', '%[3]s', now(), now(), '{}',
		       CASE WHEN '%[3]s' IN ('DONE', 'FAILED') THEN now() END, '%[5]s'
		  FROM operations WHERE booking_id = 900;
		INSERT INTO fake_payments.charges (idempotency_key, booking_id, amount_cents, outcome, reject_reason, completes_at)
		SELECT step_key, 900, 2500, '%[4]s', CASE WHEN '%[4]s' = 'REJECTED' THEN 'declined' END, now() - interval '1 second'
		  FROM operation_steps WHERE name = 'charge_deposit';`, booking, slot, chargeState, outcome, truth)
}

// cancelled is SQL for a cancellation of policyID done right: every step
// DONE, the policy CANCELLED, the provider's and the payments service's
// records of their keys COMPLETED.
func cancelled(policyID int) string {
	return operation(policyID, "SUCCEEDED", "NULL", "DONE", "DONE", "DONE", "DONE", "DONE", "DONE") + fmt.Sprintf(`
		UPDATE policies SET status = 'CANCELLED' WHERE id = %[1]d;
		INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
		SELECT s.step_key, %[1]d, 'ACCEPTED', now() - interval '3 minutes'
		  FROM operation_steps s JOIN operations o ON o.id = s.operation_id
		 WHERE o.policy_id = %[1]d AND s.name = 'provider_cancel';
		INSERT INTO fake_payments.refunds (idempotency_key, policy_id, amount_cents, outcome, completes_at)
		SELECT s.step_key, %[1]d, 100, 'ACCEPTED', now() - interval '3 minutes'
		  FROM operation_steps s JOIN operations o ON o.id = s.operation_id
		 WHERE o.policy_id = %[1]d AND s.name = 'refund';`, policyID)
}

// Invariant 6 counts from when an operation is claimable (reader's finding
// 14): one waiting out a backoff (the 5 min a timeline names while a system
// is away) is not stuck, however long ago its lease ended; once its
// backoff is over as long as the bound, it is.
func TestAnOperationWaitingOutItsBackoffIsNotStuck(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, operation(4, "RECOVERING", "now() - interval '1 hour'",
		"DONE", "UNKNOWN", "PENDING", "PENDING", "PENDING", "PENDING")+`
		UPDATE operations SET next_attempt_at = now() + interval '4 minutes' WHERE policy_id = 4;`); err != nil {
		t.Fatal(err)
	}
	stuck := func() bool {
		t.Helper()
		r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range r.Violations {
			if v.Invariant == 6 {
				return true
			}
		}
		return false
	}
	if stuck() {
		t.Errorf("an operation backing off for 4 more minutes is reported stuck")
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE operations SET next_attempt_at = now() - interval '2 minutes' WHERE policy_id = 4`); err != nil {
		t.Fatal(err)
	}
	if !stuck() {
		t.Errorf("an operation claimable for 2 minutes past a 1-minute bound is not reported")
	}
}
