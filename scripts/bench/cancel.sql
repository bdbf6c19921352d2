-- One cancellation as the app commits it, for pgbench (scripts/bench/bench.sh).
-- The writes of internal/idempotency/store.go, internal/workflow/run.go (with
-- the cancellation's steps, internal/policies/steps.go), internal/events and
-- the two fakes, in the same commits:
--   tx 1 (the key's claim, the intent, provider_cancel SENT) · the provider's tx ·
--   tx 2 (its outcome, mark_cancelled, publish_event, refund SENT) ·
--   the payments service's tx · tx 3 (the refund's outcome, audit, the answer).
-- Each write is sent as the app sends it now (docs/performance.md, round
-- trips): a step's SENT records its call in the same statement, an answer's
-- row rides with the step's answered write, the local steps in a row are
-- marked DONE together, mark_cancelled's UPDATE returns the refund owed
-- (read once). Left out, because they write nothing: the
-- bearer-token lookup, the key lookup, the fakes' fault and status lookups.
-- pgbench cannot COPY: the app lays a run's steps out with COPY (one WAL
-- record for a page of rows), the floor with INSERT … SELECT (one per row),
-- so the floor writes about five WAL records more than the app there.
-- The floor is of the commits and the writes; the events' delivery (relay,
-- consumers) is not in it: the app's run to compare with delivers them in
-- another process (EVENTS_WORKERS=off, `web events`).

-- The next ACTIVE policy in a shuffled order (policy-order.sql; the run's
-- sequence hands each out once) and its owner.
SELECT id AS pid, user_id AS uid FROM pgbench_policy_order WHERE n = (SELECT nextval('pgbench_policy_seq')) \gset

-- 1. The key's claim, the first statement of the workflow's first transaction
--    (Attempt.Claim), then record_intent, the steps, provider_cancel SENT and
--    its call, the events.
BEGIN;
INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
                              lease_expires_at, created_at, expires_at)
SELECT :uid::bigint, 'pgbench-cancel-' || :pid::bigint, sha256(('cancel ' || :pid::bigint)::bytea), 'IN_PROGRESS', gen_random_uuid(),
       now() + interval '30 seconds', now(), now() + interval '24 hours'
    ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING owner_token AS key_token \gset
INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, reason, status,
                        owner_token, owner_id, lease_expires_at)
SELECT id, 'CANCEL', user_id, 'pgbench-cancel-' || :pid::bigint, 'pgbench', 'IN_PROGRESS',
       gen_random_uuid(), 'pgbench', now() + interval '30 seconds'
  FROM policies
 WHERE id = :pid::bigint AND user_id = :uid::bigint AND status = 'ACTIVE'
    ON CONFLICT (policy_id, operation_type) DO NOTHING
RETURNING id AS opid, owner_token AS op_token \gset
INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, finished_at, updated_at)
SELECT :opid::bigint, 1, s.position, s.name, :opid::text || ':' || s.name, s.system,
       CASE WHEN s.position = 1 THEN 'DONE' ELSE 'PENDING' END, CASE WHEN s.position = 1 THEN now() END, now()
  FROM (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
               (4, 'publish_event', NULL), (5, 'refund', 'payments'), (6, 'audit', NULL)) AS s(position, name, system);
WITH owner AS ( -- the lease is renewed only when less than half a lease would be left at the deadline
    SELECT id, lease_expires_at < now() + interval '2 seconds' + interval '15 seconds' AS short FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND cancel_requested_at IS NULL
       FOR UPDATE),
renewed AS (
    UPDATE operations o SET lease_expires_at = now() + interval '30 seconds' FROM owner WHERE o.id = owner.id AND owner.short),
sent AS (
    UPDATE operation_steps s
       SET state = 'SENT', attempts = s.attempts + 1, deadline_at = greatest(s.deadline_at, now() + interval '2 seconds'),
           sent_at = clock_timestamp(), request = coalesce(s.request, '{"policy_id": 1, "reason": "pgbench"}'),
           traceparent = coalesce('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', s.traceparent), updated_at = now()
      FROM owner
     WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = 'provider_cancel' AND s.state IN ('PENDING', 'SENT', 'UNKNOWN')
    RETURNING s.*),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, owner_token, attempt, deadline_at, request, at)
    SELECT operation_id, step_key, 'call', system, 'pgbench', :op_token::uuid, attempts, now() + interval '2 seconds', request, sent_at
      FROM sent
    RETURNING id)
SELECT recorded.id AS call1, sent.state FROM sent, recorded \gset
INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail,
                                statement, branch, step)
SELECT :opid::bigint, l.ids[1], l.ids, ARRAY[NULL, 'IN_PROGRESS']::text[], ARRAY['IN_PROGRESS', 'IN_PROGRESS'],
       ARRAY['pgbench', 'pgbench'], ARRAY[:op_token::uuid, :op_token::uuid],
       ARRAY['requested', 'sent (attempt 1)'], ARRAY['insert_steps', 'step_sent'], NULL, ARRAY['record_intent', 'provider_cancel']
  FROM (SELECT ARRAY[nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq')] AS ids) AS l;
COMMIT;

-- 2. The provider records the request and applies the effect (fake.receive).
BEGIN;
INSERT INTO fake_provider.requests (idempotency_key, policy_id, reason, outcome, reject_reason, completes_at)
VALUES (:opid::text || ':' || 'provider_cancel', :pid::bigint, 'pgbench', 'ACCEPTED', NULL, now())
    ON CONFLICT (idempotency_key) DO NOTHING;
INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
VALUES (:opid::text || ':' || 'provider_cancel', :pid::bigint, now());
COMMIT;

-- 3. The provider's outcome, mark_cancelled, publish_event, refund SENT.
BEGIN;
WITH owner AS (
    SELECT id FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       FOR UPDATE),
answered AS (
    UPDATE operation_steps s SET state = 'DONE', truth = 'COMPLETED', answer = '{"outcome": "confirmed"}', finished_at = clock_timestamp(), updated_at = now()
      FROM owner WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = 'provider_cancel' AND s.state IN ('SENT', 'UNKNOWN')
    RETURNING s.*),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, call_id, system, actor, owner_token, outcome, truth, detail, took_ms, at)
    SELECT operation_id, step_key, 'answer', :call1::bigint, system, 'pgbench', :op_token::uuid, 'confirmed', 'COMPLETED', 'provider confirmed', 5, finished_at
      FROM answered)
SELECT state FROM answered;
-- the two local steps that follow, marked DONE together
WITH owner AS (
    SELECT id FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND cancel_requested_at IS NULL
       FOR UPDATE)
UPDATE operation_steps s SET state = 'DONE', finished_at = (SELECT clock_timestamp()), updated_at = now()
  FROM owner WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = ANY (ARRAY['mark_cancelled', 'publish_event'])
   AND s.state = 'PENDING';
-- the policy CANCELLED, returning what it refunds (read once, for the event and the refund)
UPDATE policies SET status = 'CANCELLED', updated_at = now() WHERE id = :pid::bigint AND status = 'ACTIVE'
RETURNING number, round(premium * 100 * greatest(0, coverage_end - greatest(current_date, coverage_start))
                        / (coverage_end - coverage_start))::bigint AS cents \gset
WITH place AS ( -- the aggregate's next place, as events.Writer takes it (per-aggregate order)
    INSERT INTO outbox_sequences AS s (key, last_seq) VALUES ('policy:' || :pid::text, 1)
        ON CONFLICT (key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq), written AS (
    INSERT INTO outbox (id, type, key, payload, transport, status, seq)
    SELECT gen_random_uuid(), 'policy.cancelled', 'policy:' || :pid::text, '{"policy_id": 1}', c.transport, 'PENDING', place.last_seq
      FROM events_config c, place
    RETURNING transport, created_at)
SELECT transport, created_at, pg_notify('idemlab_outbox', transport) FROM written;
WITH owner AS ( -- the lease is renewed only when less than half a lease would be left at the deadline
    SELECT id, lease_expires_at < now() + interval '2 seconds' + interval '15 seconds' AS short FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND cancel_requested_at IS NULL
       FOR UPDATE),
renewed AS (
    UPDATE operations o SET lease_expires_at = now() + interval '30 seconds' FROM owner WHERE o.id = owner.id AND owner.short),
sent AS (
    UPDATE operation_steps s
       SET state = 'SENT', attempts = s.attempts + 1, deadline_at = greatest(s.deadline_at, now() + interval '2 seconds'),
           sent_at = clock_timestamp(), request = coalesce(s.request, '{"policy_id": 1, "amount_cents": 100}'),
           traceparent = coalesce('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', s.traceparent), updated_at = now()
      FROM owner
     WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = 'refund' AND s.state IN ('PENDING', 'SENT', 'UNKNOWN')
    RETURNING s.*),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, owner_token, attempt, deadline_at, request, at)
    SELECT operation_id, step_key, 'call', system, 'pgbench', :op_token::uuid, attempts, now() + interval '2 seconds', request, sent_at
      FROM sent
    RETURNING id)
SELECT recorded.id AS call2, sent.state FROM sent, recorded \gset
INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail,
                                statement, branch, step)
SELECT :opid::bigint, l.ids[1], l.ids, ARRAY['IN_PROGRESS', 'IN_PROGRESS', 'IN_PROGRESS', 'IN_PROGRESS']::text[], ARRAY['IN_PROGRESS', 'IN_PROGRESS', 'IN_PROGRESS', 'IN_PROGRESS'],
       ARRAY['pgbench', 'pgbench', 'pgbench', 'pgbench'], ARRAY[:op_token::uuid, :op_token::uuid, :op_token::uuid, :op_token::uuid],
       ARRAY['provider confirmed', 'policy cancelled', 'policy.cancelled written', 'sent (attempt 1)'], ARRAY['step_answered', 'steps_done', 'steps_done', 'step_sent'], NULL, ARRAY['provider_cancel', 'mark_cancelled', 'publish_event', 'refund']
  FROM (SELECT ARRAY[nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq')] AS ids) AS l;
COMMIT;

-- 4. The payments service records the refund and moves the money (fake receiveRefund).
BEGIN;
INSERT INTO fake_payments.refunds (idempotency_key, policy_id, amount_cents, reason, outcome, completes_at)
VALUES (:opid::text || ':' || 'refund', :pid::bigint, :cents::bigint, 'pgbench', 'ACCEPTED', now())
    ON CONFLICT (idempotency_key) DO NOTHING;
INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, amount_cents, applied_at)
VALUES ('refund', :opid::text || ':' || 'refund', :pid::bigint, :cents::bigint, now());
COMMIT;

-- 5. The refund's outcome, audit, SUCCEEDED, the events, the key's stored
--    answer — one commit (the workflow with the handler's Finish).
BEGIN;
WITH owner AS (
    SELECT id FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       FOR UPDATE),
answered AS (
    UPDATE operation_steps s SET state = 'DONE', truth = 'COMPLETED', answer = '{"outcome": "confirmed"}', finished_at = clock_timestamp(), updated_at = now()
      FROM owner WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = 'refund' AND s.state IN ('SENT', 'UNKNOWN')
    RETURNING s.*),
recorded AS (
    INSERT INTO operation_calls (operation_id, step_key, kind, call_id, system, actor, owner_token, outcome, truth, detail, took_ms, at)
    SELECT operation_id, step_key, 'answer', :call2::bigint, system, 'pgbench', :op_token::uuid, 'confirmed', 'COMPLETED', 'payments confirmed', 5, finished_at
      FROM answered)
SELECT state FROM answered;
WITH owner AS (
    SELECT id FROM operations
     WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING')
       AND cancel_requested_at IS NULL
       FOR UPDATE)
UPDATE operation_steps s SET state = 'DONE', finished_at = (SELECT clock_timestamp()), updated_at = now()
  FROM owner WHERE s.operation_id = owner.id AND s.run = 1 AND s.name = 'audit' AND s.state = 'PENDING';
INSERT INTO audit_entries (operation_id, step_key, actor, summary, facts)
VALUES (:opid::bigint, :opid::text || ':' || 'audit', 'pgbench', 'policy cancelled', '{"policy_id": 1}');
UPDATE operations
   SET status = 'SUCCEEDED', released = NULL, next_attempt_at = NULL, last_error = NULL, finished_at = clock_timestamp(), updated_at = now()
 WHERE id = :opid::bigint AND owner_token = :op_token::uuid AND status IN ('IN_PROGRESS', 'RECOVERING');
INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail,
                                statement, branch, step)
SELECT :opid::bigint, l.ids[1], l.ids, ARRAY['IN_PROGRESS', 'IN_PROGRESS', 'IN_PROGRESS']::text[], ARRAY['IN_PROGRESS', 'IN_PROGRESS', 'SUCCEEDED'],
       ARRAY['pgbench', 'pgbench', 'pgbench'], ARRAY[:op_token::uuid, :op_token::uuid, :op_token::uuid],
       ARRAY['payments confirmed', 'audit entry written', 'every step done'], ARRAY['step_answered', 'steps_done', 'succeed'], NULL, ARRAY['refund', 'audit', NULL]
  FROM (SELECT ARRAY[nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq'), nextval('operation_timeline_line_seq')] AS ids) AS l;
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = 200,
       response_headers = '{"Content-Type": ["application/json"]}',
       response_body = convert_to(repeat('x', 2500), 'UTF8'),
       completed_at = now(), expires_at = now() + interval '24 hours'
 WHERE user_id = :uid::bigint AND idempotency_key = 'pgbench-cancel-' || :pid::bigint
   AND owner_token = :key_token::uuid AND status = 'IN_PROGRESS';
COMMIT;
