-- One cancellation as the app commits it, for pgbench (scripts/bench/bench.sh).
-- The writes of internal/idempotency/store.go, internal/policies/transitions.go
-- and internal/provider/fake/state.go, in the same four commits:
--   claim tx · operation tx · provider tx · completion tx.
-- Left out, because they write nothing: the bearer-token lookup, the key
-- lookup, and the provider's fault lookup. The floor is of the commits.

-- The next ACTIVE policy (the run's sequence hands each out once) and its owner.
SELECT id AS pid, user_id AS uid FROM policies WHERE id = (SELECT nextval('pgbench_policy_seq')) \gset

-- 1. Claim the idempotency key (autocommit, Store.Claim).
INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
                              lease_expires_at, created_at, expires_at)
SELECT :uid, 'pgbench-cancel-' || :pid, sha256(('cancel ' || :pid)::bytea), 'IN_PROGRESS', gen_random_uuid(),
       now() + interval '30 seconds', now(), now() + interval '24 hours'
    ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING owner_token AS key_token \gset

-- 2. Record the intent and its first event (StartCancellation).
BEGIN;
INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, reason, status,
                               owner_token, owner_id, lease_expires_at, provider_key, steps)
SELECT id, 'CANCEL', user_id, 'pgbench-cancel-' || :pid, 'pgbench', 'IN_PROGRESS',
       gen_random_uuid(), 'pgbench', now() + interval '30 seconds', format('policy-%s-cancel-1', id),
       '{"record_intent": "DONE", "provider_cancel": "PENDING", "mark_cancelled": "PENDING"}'
  FROM policies
 WHERE id = :pid AND user_id = :uid AND status = 'ACTIVE'
    ON CONFLICT DO NOTHING
RETURNING id AS opid, owner_token AS op_token \gset
INSERT INTO operation_events (operation_id, from_status, to_status, actor, owner_token, detail, statement)
VALUES (:opid, NULL, 'IN_PROGRESS', 'pgbench', :op_token::uuid, 'cancellation requested', repeat('-', 700));
COMMIT;

-- 3. The provider records the request and applies the effect (fake.receive).
BEGIN;
INSERT INTO fake_provider.requests (idempotency_key, policy_id, reason, outcome, reject_reason, completes_at)
VALUES ('policy-' || :pid || '-cancel-1', :pid, 'pgbench', 'ACCEPTED', NULL, now())
    ON CONFLICT (idempotency_key) DO NOTHING;
INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
VALUES ('policy-' || :pid || '-cancel-1', :pid, now());
COMMIT;

-- 4. Completion: operation SUCCEEDED, policy CANCELLED, event, the key's
--    stored answer — one commit (Canceller.Record with the handler's Finish).
BEGIN;
SELECT status FROM policy_operations WHERE id = :opid FOR UPDATE;
UPDATE policy_operations
   SET status = 'SUCCEEDED', provider_truth = 'COMPLETED',
       steps = steps || '{"provider_cancel": "DONE", "mark_cancelled": "DONE"}',
       finished_at = now(), updated_at = now()
 WHERE id = :opid AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING');
UPDATE policies SET status = 'CANCELLED', updated_at = now() WHERE id = :pid AND status = 'ACTIVE';
INSERT INTO operation_events (operation_id, from_status, to_status, actor, owner_token, detail, statement)
VALUES (:opid, 'IN_PROGRESS', 'SUCCEEDED', 'pgbench', :op_token::uuid, 'provider confirmed the cancellation', repeat('-', 900));
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = 200,
       response_headers = '{"Content-Type": ["application/json"]}',
       response_body = convert_to(repeat('x', 700), 'UTF8'),
       completed_at = now(), expires_at = now() + interval '24 hours'
 WHERE user_id = :uid AND idempotency_key = 'pgbench-cancel-' || :pid
   AND owner_token = :key_token::uuid AND status = 'IN_PROGRESS';
COMMIT;
