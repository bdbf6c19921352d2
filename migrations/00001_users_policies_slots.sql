-- +goose Up

-- Demo customers and the admin. API tokens are stored only as SHA-256 hashes:
-- the plain token is shown once (README, start-up banner) and never read back.
CREATE TABLE users (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text        NOT NULL,
    role             text        NOT NULL DEFAULT 'customer',
    api_token_sha256 bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- one account per name: the seed relies on it to be idempotent
    CONSTRAINT users_name_key UNIQUE (name),
    -- a bearer token identifies exactly one user
    CONSTRAINT users_api_token_key UNIQUE (api_token_sha256),
    CONSTRAINT users_role_check CHECK (role IN ('customer', 'admin'))
);

CREATE TABLE policies (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    bigint        NOT NULL REFERENCES users (id),
    number     text          NOT NULL,
    holder     text          NOT NULL,
    premium    numeric(10,2) NOT NULL,
    status     text          NOT NULL DEFAULT 'ACTIVE',
    created_at timestamptz   NOT NULL DEFAULT now(),
    updated_at timestamptz   NOT NULL DEFAULT now(),
    -- a policy number is the business's name for the policy
    CONSTRAINT policies_number_key UNIQUE (number),
    CONSTRAINT policies_status_check CHECK (status IN ('ACTIVE', 'CANCELLED')),
    CONSTRAINT policies_premium_check CHECK (premium >= 0)
);
-- every customer query is "my policies, in id order": this index serves it and its cursor
CREATE INDEX policies_user_id_id_idx ON policies (user_id, id);

-- Bookable slots. A slot is BOOKED exactly when booking_id names its confirmed booking.
CREATE TABLE slots (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource   text        NOT NULL,
    starts_at  timestamptz NOT NULL,
    ends_at    timestamptz NOT NULL,
    status     text        NOT NULL DEFAULT 'AVAILABLE',
    booking_id bigint,
    -- one slot per resource and start time: the seed relies on it to be idempotent
    CONSTRAINT slots_resource_starts_at_key UNIQUE (resource, starts_at),
    CONSTRAINT slots_status_check CHECK (status IN ('AVAILABLE', 'BOOKED')),
    CONSTRAINT slots_period_check CHECK (ends_at > starts_at),
    -- BOOKED if and only if a booking holds the slot
    CONSTRAINT slots_booked_has_booking_check CHECK ((status = 'BOOKED') = (booking_id IS NOT NULL))
);
CREATE INDEX slots_status_idx ON slots (status, id);

CREATE TABLE bookings (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot_id    bigint      NOT NULL REFERENCES slots (id),
    user_id    bigint      NOT NULL REFERENCES users (id),
    status     text        NOT NULL DEFAULT 'CONFIRMED',
    created_at timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz,
    CONSTRAINT bookings_status_check CHECK (status IN ('CONFIRMED', 'CANCELLED'))
);
-- The last line of defence against double booking: whatever the application
-- does, the database holds at most one CONFIRMED booking per slot.
CREATE UNIQUE INDEX bookings_one_confirmed_per_slot ON bookings (slot_id) WHERE status = 'CONFIRMED';
CREATE INDEX bookings_user_id_idx ON bookings (user_id, id);

-- a slot can only point at a booking that exists (deferred: the booking and the
-- slot are written in one transaction, in either order)
ALTER TABLE slots ADD CONSTRAINT slots_booking_id_fkey
    FOREIGN KEY (booking_id) REFERENCES bookings (id) DEFERRABLE INITIALLY DEFERRED;

-- +goose Down
ALTER TABLE slots DROP CONSTRAINT slots_booking_id_fkey;
DROP TABLE bookings;
DROP TABLE slots;
DROP TABLE policies;
DROP TABLE users;
