package invariants_test

import (
	"context"
	"testing"

	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkCheck100k is the promise of issue 8: GET /api/v1/invariants stays
// cheap enough to poll during a load test — under ~200 ms with 100k rows in
// every table it reads (policies, operations, provider requests and effects,
// idempotency keys, bookings).
//
//	go test -run '^$' -bench Check100k ./internal/invariants/
func BenchmarkCheck100k(b *testing.B) {
	db := testdb.New(b)
	ctx := context.Background()
	const n = 100_000
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO users (name, role, api_token_sha256)
		SELECT format('bench-%s', i), 'customer', sha256(i::text::bytea)
		  FROM generate_series(1, 1000) AS i;

		INSERT INTO policies (user_id, number, holder, premium, status)
		SELECT 1 + i % 1000, format('B-%s', i), 'Bench', 100, CASE WHEN i % 2 = 0 THEN 'CANCELLED' ELSE 'ACTIVE' END
		  FROM generate_series(1, 100000) AS i;

		INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status,
		                               owner_token, lease_expires_at, provider_key, provider_truth, finished_at)
		SELECT id, 'CANCEL', user_id, format('k-%s', id), 'SUCCEEDED',
		       gen_random_uuid(), now(), format('policy-%s-cancel-1', id), 'COMPLETED', now()
		  FROM policies WHERE status = 'CANCELLED';
		INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status,
		                               owner_token, lease_expires_at, provider_key)
		SELECT id, 'CANCEL', user_id, format('k-%s', id), 'IN_PROGRESS',
		       gen_random_uuid(), now() + interval '1 hour', format('policy-%s-cancel-1', id)
		  FROM policies WHERE status = 'ACTIVE' AND id % 10 = 1;

		INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
		SELECT provider_key, policy_id, 'ACCEPTED', now() - interval '1 second' FROM policy_operations;
		INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
		SELECT provider_key, policy_id, now() - interval '1 second' FROM policy_operations;

		INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
		                              lease_expires_at, response_status, response_headers, response_body,
		                              created_at, completed_at, expires_at)
		SELECT 1 + i % 1000, format('key-%s', i), sha256(i::text::bytea), 'COMPLETED', gen_random_uuid(),
		       now(), 200, '{}', '\x7b7d', now(), now(), now() + interval '1 day'
		  FROM generate_series(1, 100000) AS i;

		INSERT INTO slots (resource, starts_at, ends_at)
		SELECT 'room', timestamptz '2030-01-01' + i * interval '1 hour', timestamptz '2030-01-01' + (i + 1) * interval '1 hour'
		  FROM generate_series(1, 100000) AS i;
		INSERT INTO bookings (slot_id, user_id, status, cancelled_at)
		SELECT id, 1 + id % 1000, 'CANCELLED', now() FROM slots;
		ANALYZE;`)
	if err != nil {
		b.Fatal(err)
	}
	_ = n
	r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: 0})
	if err != nil || !r.OK {
		b.Fatalf("check: %v %+v", err, r.Violations)
	}
	for b.Loop() {
		if _, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: 0}); err != nil {
			b.Fatal(err)
		}
	}
}
