-- +goose Up

-- The deposit saga (docs/saga.md, internal/slots/deposit.go). Some slots need
-- a deposit, charged at the payments service. Booking one spans two systems,
-- so it cannot be one transaction: the slot is HELD for a PENDING booking in
-- the booking's transaction, the deposit is charged under the step's key, and
-- only then is the booking CONFIRMED and the slot BOOKED — or, on a definite
-- refusal, the hold is released and the booking FAILED.

-- A slot's deposit, in cents; NULL: no deposit needed. Every slot of a
-- resource that needs one carries it (the demo's "Recording studio"), so the
-- booking's conditional UPDATE decides on the slot's row alone.
ALTER TABLE slots ADD COLUMN deposit_cents bigint;
ALTER TABLE slots ADD CONSTRAINT slots_deposit_check CHECK (deposit_cents BETWEEN 1 AND 100000000);

-- HELD: a deposit booking holds the slot while its deposit is charged. Until
-- when, for other bookers to read (409 slot-held says it). The time is not a
-- licence to release: a hold is released only when its charge is known not
-- to exist (refused, or NOT_STARTED after every deadline) — see docs/saga.md.
ALTER TABLE slots ADD COLUMN held_until timestamptz;
ALTER TABLE slots DROP CONSTRAINT slots_status_check;
ALTER TABLE slots ADD CONSTRAINT slots_status_check CHECK (status IN ('AVAILABLE', 'HELD', 'BOOKED'));
-- a slot names its booking exactly when it is HELD or BOOKED
ALTER TABLE slots DROP CONSTRAINT slots_booked_has_booking_check;
ALTER TABLE slots ADD CONSTRAINT slots_booked_has_booking_check
    CHECK ((status IN ('HELD', 'BOOKED')) = (booking_id IS NOT NULL));
-- a hold says until when, and only a hold does
ALTER TABLE slots ADD CONSTRAINT slots_held_until_check CHECK ((status = 'HELD') = (held_until IS NOT NULL));
-- only a slot that needs a deposit is ever held: a hold is the saga's first step
ALTER TABLE slots ADD CONSTRAINT slots_held_needs_deposit_check CHECK (status <> 'HELD' OR deposit_cents IS NOT NULL);

-- PENDING: the booking holds its slot while its deposit is charged.
-- FAILED: the deposit was refused (or known never charged) and the hold released.
ALTER TABLE bookings DROP CONSTRAINT bookings_status_check;
ALTER TABLE bookings ADD CONSTRAINT bookings_status_check
    CHECK (status IN ('PENDING', 'CONFIRMED', 'CANCELLED', 'FAILED'));
-- the deposit the booking owes, copied from the slot when it was held: the
-- charge's amount, and the refund's when it is cancelled
ALTER TABLE bookings ADD COLUMN deposit_cents bigint;
ALTER TABLE bookings ADD CONSTRAINT bookings_deposit_check CHECK (deposit_cents BETWEEN 1 AND 100000000);
-- a booking is PENDING or FAILED only as part of the deposit saga
ALTER TABLE bookings ADD CONSTRAINT bookings_pending_has_deposit_check
    CHECK (status NOT IN ('PENDING', 'FAILED') OR deposit_cents IS NOT NULL);
-- At most one live booking (holding or confirmed) per slot: the last line of
-- defence behind the conditional UPDATE, as bookings_one_confirmed_per_slot is.
CREATE UNIQUE INDEX bookings_one_live_per_slot ON bookings (slot_id) WHERE status IN ('PENDING', 'CONFIRMED');

-- The deposit saga's two workflows, on the booking as their subject
-- (operations_booking_type_key: one of each per booking).
ALTER TABLE operations DROP CONSTRAINT operations_type_check;
ALTER TABLE operations ADD CONSTRAINT operations_type_check
    CHECK (operation_type IN ('CANCEL', 'BOOK_DEPOSIT', 'CANCEL_DEPOSIT'));
-- the booking pages find a booking's operations by it
CREATE INDEX operations_booking_idx ON operations (booking_id) WHERE booking_id IS NOT NULL;

-- The race lab runs the slots store's own SQL on its schema (00052), so its
-- tables keep the store's shape. Its slots never need a deposit.
ALTER TABLE race_lab.slots ADD COLUMN deposit_cents bigint;
ALTER TABLE race_lab.slots ADD COLUMN held_until timestamptz;
ALTER TABLE race_lab.bookings ADD COLUMN deposit_cents bigint;

-- +goose Down
ALTER TABLE race_lab.bookings DROP COLUMN deposit_cents;
ALTER TABLE race_lab.slots DROP COLUMN held_until;
ALTER TABLE race_lab.slots DROP COLUMN deposit_cents;
DROP INDEX operations_booking_idx;
DELETE FROM operation_calls WHERE operation_id IN (SELECT id FROM operations WHERE booking_id IS NOT NULL);
DELETE FROM operation_events WHERE operation_id IN (SELECT id FROM operations WHERE booking_id IS NOT NULL);
DELETE FROM operation_steps WHERE operation_id IN (SELECT id FROM operations WHERE booking_id IS NOT NULL);
DELETE FROM operations WHERE booking_id IS NOT NULL;
ALTER TABLE operations DROP CONSTRAINT operations_type_check;
ALTER TABLE operations ADD CONSTRAINT operations_type_check CHECK (operation_type IN ('CANCEL'));
DROP INDEX bookings_one_live_per_slot;
UPDATE slots SET status = 'AVAILABLE', booking_id = NULL WHERE status = 'HELD';
DELETE FROM bookings WHERE status IN ('PENDING', 'FAILED');
ALTER TABLE bookings DROP CONSTRAINT bookings_pending_has_deposit_check;
ALTER TABLE bookings DROP CONSTRAINT bookings_deposit_check;
ALTER TABLE bookings DROP COLUMN deposit_cents;
ALTER TABLE bookings DROP CONSTRAINT bookings_status_check;
ALTER TABLE bookings ADD CONSTRAINT bookings_status_check CHECK (status IN ('CONFIRMED', 'CANCELLED'));
ALTER TABLE slots DROP CONSTRAINT slots_held_needs_deposit_check;
ALTER TABLE slots DROP CONSTRAINT slots_held_until_check;
ALTER TABLE slots DROP CONSTRAINT slots_booked_has_booking_check;
ALTER TABLE slots ADD CONSTRAINT slots_booked_has_booking_check CHECK ((status = 'BOOKED') = (booking_id IS NOT NULL));
ALTER TABLE slots DROP CONSTRAINT slots_status_check;
ALTER TABLE slots ADD CONSTRAINT slots_status_check CHECK (status IN ('AVAILABLE', 'BOOKED'));
ALTER TABLE slots DROP COLUMN held_until;
ALTER TABLE slots DROP CONSTRAINT slots_deposit_check;
ALTER TABLE slots DROP COLUMN deposit_cents;
