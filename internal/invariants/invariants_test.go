package invariants_test

import (
	"context"
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
			INSERT INTO bookings (slot_id, user_id) VALUES (1, 1), (1, 2)`},
		{4, "a cancelled policy without an operation", `
			UPDATE policies SET status = 'CANCELLED' WHERE id = 1`},
		{4, "a succeeded operation the provider never saw", `
			INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status, provider_key)
			SELECT id, 'CANCEL', user_id, 'k', 'SUCCEEDED', 'never-sent' FROM policies WHERE id = 2;
			UPDATE policies SET status = 'CANCELLED' WHERE id = 2`},
		{4, "a failed operation the provider applied", `
			INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status, provider_key)
			SELECT id, 'CANCEL', user_id, 'k', 'FAILED', 'applied-key' FROM policies WHERE id = 3;
			INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
			VALUES ('applied-key', 3, 'ACCEPTED', now())`},
		{6, "an operation stuck long after its lease", `
			INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status,
			                               owner_token, lease_expires_at, provider_key)
			SELECT id, 'CANCEL', user_id, 'k', 'IN_PROGRESS', gen_random_uuid(), now() - interval '1 hour', 'stuck'
			  FROM policies WHERE id = 4`},
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
