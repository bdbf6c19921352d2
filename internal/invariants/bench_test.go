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

		INSERT INTO policies (user_id, number, holder, premium, status, coverage_start, coverage_end)
		SELECT 1 + i % 1000, format('B-%s', i), 'Bench', 100, CASE WHEN i % 2 = 0 THEN 'CANCELLED' ELSE 'ACTIVE' END,
		       current_date - 30, current_date + 335
		  FROM generate_series(1, 100000) AS i;

		INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
		                        owner_token, lease_expires_at, finished_at)
		SELECT id, 'CANCEL', user_id, format('k-%s', id), 'SUCCEEDED', gen_random_uuid(), now(), now()
		  FROM policies WHERE status = 'CANCELLED';
		INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
		                        owner_token, lease_expires_at)
		SELECT id, 'CANCEL', user_id, format('k-%s', id), 'IN_PROGRESS', gen_random_uuid(), now() + interval '1 hour'
		  FROM policies WHERE status = 'ACTIVE' AND id % 10 = 1;
		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, deadline_at, sent_at,
		                             request, finished_at)
		SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system, st.state,
		       CASE WHEN st.state = 'SENT' THEN now() END, CASE WHEN st.state = 'SENT' THEN now() END,
		       CASE WHEN st.state = 'SENT' THEN '{}'::jsonb END, CASE WHEN st.state = 'DONE' THEN now() END
		  FROM operations o,
		       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
		               (4, 'publish_event', NULL), (5, 'refund', 'payments'), (6, 'audit', NULL)) AS s(position, name, system),
		       LATERAL (SELECT CASE WHEN o.status = 'SUCCEEDED' OR s.position = 1 THEN 'DONE'
		                            WHEN s.position = 2 THEN 'SENT' ELSE 'PENDING' END AS state) st;

		INSERT INTO fake_provider.requests (idempotency_key, policy_id, outcome, completes_at)
		SELECT o.id || ':provider_cancel', o.policy_id, 'ACCEPTED', now() - interval '1 second' FROM operations o;
		INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
		SELECT o.id || ':provider_cancel', o.policy_id, now() - interval '1 second' FROM operations o;
		INSERT INTO fake_payments.refunds (idempotency_key, policy_id, amount_cents, outcome, completes_at)
		SELECT o.id || ':refund', o.policy_id, 100, 'ACCEPTED', now() - interval '1 second' FROM operations o WHERE o.status = 'SUCCEEDED';
		INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, amount_cents, applied_at)
		SELECT 'refund', o.id || ':refund', o.policy_id, 100, now() - interval '1 second' FROM operations o WHERE o.status = 'SUCCEEDED';

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
