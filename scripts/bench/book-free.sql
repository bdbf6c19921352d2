-- One booking of a free slot as the app commits it, for pgbench
-- (scripts/bench/bench.sh): the workflow of internal/slots/workflow.go in ONE
-- commit — the key's claim (internal/idempotency, Attempt.Claim), the
-- conditional UPDATE and the booking row (internal/slots/booking.go), the
-- booking.confirmed event (internal/events, the outbox), the key's stored
-- answer. Each client books slots nobody else books: no contention, so the
-- floor is the commit itself. Left out, because they write nothing: the
-- bearer-token lookup and the key lookup.

-- The next never-booked slot (the run's sequence hands each out once).
SELECT nextval('pgbench_slot_seq') AS sid, nextval('pgbench_key_seq') AS k \gset
\set uid random(1, 3)

BEGIN;
-- (The app sends the claim in one batch with the bound of its wait, lock_timeout
-- set and lifted around it: one round trip, as this INSERT alone.)
INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
                              lease_expires_at, created_at, expires_at)
SELECT :uid, 'pgbench-free-' || :k, sha256(('book ' || :k)::bytea), 'IN_PROGRESS', gen_random_uuid(),
       now() + interval '30 seconds', now(), now() + interval '24 hours'
    ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING owner_token AS key_token \gset
UPDATE slots
   SET status = 'BOOKED',
       booking_id = nextval(pg_get_serial_sequence('bookings', 'id'))
 WHERE id = :sid
   AND status = 'AVAILABLE'
RETURNING booking_id AS bid \gset
INSERT INTO bookings (id, slot_id, user_id)
VALUES (:bid, :sid, :uid)
RETURNING id, (SELECT resource FROM slots WHERE slots.id = bookings.slot_id),
              (SELECT starts_at FROM slots WHERE slots.id = bookings.slot_id);
WITH place AS ( -- the aggregate's next place, as events.Writer takes it (per-aggregate order)
    INSERT INTO outbox_sequences AS s (key, last_seq) VALUES ('booking:' || :bid, 1)
        ON CONFLICT (key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq), written AS (
    INSERT INTO outbox (id, type, key, payload, transport, status, seq)
    SELECT gen_random_uuid(), 'booking.confirmed', 'booking:' || :bid,
           '{"booking_id": 1, "slot_id": 1, "user_id": 1, "resource": "Consulting room 1", "starts_at": "2026-12-03T09:00:00Z", "at": "2026-12-02T20:00:00Z"}',
           c.transport, 'PENDING', place.last_seq
      FROM events_config c, place
    RETURNING transport)
SELECT transport, pg_notify('idemlab_outbox', transport) FROM written;
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = 201,
       response_headers = '{"Content-Type": ["application/json"], "Location": ["/api/v1/bookings/1"]}',
       response_body = convert_to(repeat('x', 230), 'UTF8'),
       completed_at = now(), expires_at = now() + interval '24 hours'
 WHERE user_id = :uid AND idempotency_key = 'pgbench-free-' || :k
   AND owner_token = :key_token::uuid AND status = 'IN_PROGRESS';
COMMIT;
