-- One booking attempt under contention as the app commits it, for pgbench
-- (scripts/bench/bench.sh): the key's claim, the conditional UPDATE of
-- internal/slots/booking.go, the booking row, its event and the key's stored
-- answer in one commit (a loser stores its 409 slot-taken the same way). A
-- winner releases the slot at once, as loadtest's book workload does: a
-- second key and a second commit. pgbench -D slots=8 picks among slots 1..8.

\set sid random(1, :slots)
\set uid random(1, 3)
SELECT nextval('pgbench_key_seq') AS k \gset

-- 1. Claim the key, book (0 rows: taken), the event, the stored answer.
BEGIN;
INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
                              lease_expires_at, created_at, expires_at)
VALUES (:uid, 'pgbench-book-' || :k, sha256(('book ' || :k)::bytea), 'IN_PROGRESS', gen_random_uuid(),
        now() + interval '30 seconds', now(), now() + interval '24 hours')
    ON CONFLICT (user_id, idempotency_key) DO NOTHING
RETURNING owner_token AS key_token \gset
WITH claimed AS (
        UPDATE slots
           SET status = 'BOOKED',
               booking_id = nextval(pg_get_serial_sequence('bookings', 'id'))
         WHERE id = :sid
           AND status = 'AVAILABLE' -- 0 rows: someone else holds it
        RETURNING id, booking_id),
     booked AS (
        INSERT INTO bookings (id, slot_id, user_id)
        SELECT booking_id, id, :uid FROM claimed
        RETURNING id)
SELECT coalesce(max(id), 0) AS bid FROM booked \gset
\if :bid > 0
WITH place AS ( -- the aggregate's next place, as events.Writer takes it (per-aggregate order)
    INSERT INTO outbox_sequences AS s (key, last_seq) VALUES ('booking:' || :bid, 1)
        ON CONFLICT (key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq)
INSERT INTO outbox (id, type, key, payload, transport, status, seq)
SELECT gen_random_uuid(), 'booking.confirmed', 'booking:' || :bid, '{"booking_id": 1}', c.transport, 'PENDING', place.last_seq
  FROM events_config c, place;
\endif
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = CASE WHEN :bid > 0 THEN 201 ELSE 409 END,
       response_headers = '{"Content-Type": ["application/json"]}',
       response_body = convert_to(repeat('x', 200), 'UTF8'),
       completed_at = now(), expires_at = now() + interval '24 hours'
 WHERE user_id = :uid AND idempotency_key = 'pgbench-book-' || :k
   AND owner_token = :key_token::uuid AND status = 'IN_PROGRESS';
COMMIT;

\if :bid > 0
-- 2. The winner releases the slot: its own key, its own commit.
BEGIN;
INSERT INTO idempotency_keys (user_id, idempotency_key, request_fingerprint, status, owner_token,
                              lease_expires_at, created_at, expires_at)
VALUES (:uid, 'pgbench-release-' || :k, sha256(('release ' || :k)::bytea), 'IN_PROGRESS', gen_random_uuid(),
        now() + interval '30 seconds', now(), now() + interval '24 hours')
RETURNING owner_token AS release_token \gset
UPDATE bookings SET status = 'CANCELLED', cancelled_at = now() WHERE id = :bid AND status = 'CONFIRMED';
UPDATE slots SET status = 'AVAILABLE', booking_id = NULL WHERE id = :sid AND booking_id = :bid;
WITH place AS ( -- the aggregate's next place, as events.Writer takes it (per-aggregate order)
    INSERT INTO outbox_sequences AS s (key, last_seq) VALUES ('booking:' || :bid, 1)
        ON CONFLICT (key) DO UPDATE SET last_seq = s.last_seq + 1
    RETURNING last_seq)
INSERT INTO outbox (id, type, key, payload, transport, status, seq)
SELECT gen_random_uuid(), 'booking.released', 'booking:' || :bid, '{"booking_id": 1}', c.transport, 'PENDING', place.last_seq
  FROM events_config c, place;
UPDATE idempotency_keys
   SET status = 'COMPLETED', response_status = 200,
       response_headers = '{"Content-Type": ["application/json"]}',
       response_body = convert_to(repeat('x', 200), 'UTF8'),
       completed_at = now(), expires_at = now() + interval '24 hours'
 WHERE user_id = :uid AND idempotency_key = 'pgbench-release-' || :k
   AND owner_token = :release_token::uuid AND status = 'IN_PROGRESS';
COMMIT;
\endif
