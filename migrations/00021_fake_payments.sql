-- +goose Up

-- The truth of a key at any fake, defined once: REJECTED stays REJECTED; an
-- ACCEPTED request is RUNNING until completes_at, COMPLETED from then on.
-- `at` is the database clock (now()) except in tests that move time.
-- fake_provider.truth (00003) now calls it, so both fakes read one rule.
-- +goose StatementBegin
CREATE FUNCTION fault.truth(outcome text, completes_at timestamptz, at timestamptz)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT CASE
               WHEN outcome = 'REJECTED' THEN 'REJECTED'
               WHEN completes_at <= at THEN 'COMPLETED'
               ELSE 'RUNNING'
           END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fake_provider.truth(outcome text, completes_at timestamptz, at timestamptz)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT fault.truth(outcome, completes_at, at)
$$;
-- +goose StatementEnd

-- The fake payments service's own durable state (internal/payments/fake), kept
-- as another company's system would keep it: its own schema, no foreign keys
-- into idemlab's tables (it knows policies and bookings only by the ids the
-- caller sends). Its faults are in the fault schema under system 'payments'.
CREATE SCHEMA fake_payments;

-- One row per charge key the service has processed. A key with no row is
-- NOT_STARTED; the truth is computed when read (fault.truth), as at the provider.
CREATE TABLE fake_payments.charges (
    idempotency_key  text        NOT NULL,
    -- what the money is for: a deposit for a booking, or a policy
    policy_id        bigint,
    booking_id       bigint,
    amount_cents     bigint      NOT NULL,
    description      text        NOT NULL DEFAULT '',
    outcome          text        NOT NULL,
    -- why the service refused; set exactly when outcome is REJECTED
    reject_reason    text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    -- when an ACCEPTED charge completes: received_at, or received_at + slow_ms
    completes_at     timestamptz NOT NULL,
    -- how many calls with this key were processed (repeats included)
    attempts         integer     NOT NULL DEFAULT 1,
    last_received_at timestamptz NOT NULL DEFAULT now(),
    -- the service's own idempotency: one row per key; a concurrent duplicate's
    -- INSERT … ON CONFLICT waits for the first to commit, then sees its row
    CONSTRAINT charges_pkey PRIMARY KEY (idempotency_key),
    CONSTRAINT charges_subject_check CHECK ((policy_id IS NULL) <> (booking_id IS NULL)),
    CONSTRAINT charges_amount_check CHECK (amount_cents BETWEEN 1 AND 100000000),
    CONSTRAINT charges_outcome_check CHECK (outcome IN ('ACCEPTED', 'REJECTED')),
    CONSTRAINT charges_reject_reason_check CHECK ((outcome = 'REJECTED') = (reject_reason IS NOT NULL)),
    CONSTRAINT charges_attempts_check CHECK (attempts >= 1)
);

-- One row per refund key. A refund gives back part or all of a charge
-- (charge_key) or a policy's unused premium, paid outside this service
-- (policy_id): exactly one of the two.
CREATE TABLE fake_payments.refunds (
    idempotency_key  text        NOT NULL,
    charge_key       text,
    policy_id        bigint,
    amount_cents     bigint      NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    outcome          text        NOT NULL,
    reject_reason    text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    completes_at     timestamptz NOT NULL,
    attempts         integer     NOT NULL DEFAULT 1,
    last_received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT refunds_pkey PRIMARY KEY (idempotency_key),
    CONSTRAINT refunds_reference_check CHECK ((charge_key IS NULL) <> (policy_id IS NULL)),
    CONSTRAINT refunds_amount_check CHECK (amount_cents BETWEEN 1 AND 100000000),
    CONSTRAINT refunds_outcome_check CHECK (outcome IN ('ACCEPTED', 'REJECTED')),
    CONSTRAINT refunds_reject_reason_check CHECK ((outcome = 'REJECTED') = (reject_reason IS NOT NULL)),
    CONSTRAINT refunds_attempts_check CHECK (attempts >= 1)
);
-- the refunds of one charge, summed before accepting another
CREATE INDEX refunds_charge_key_idx ON fake_payments.refunds (charge_key) WHERE charge_key IS NOT NULL;

-- The ledger: one row per money movement the service actually carried out.
-- An idempotent service writes at most one row per key; one that is not
-- writes a row per processed call, which is how a double refund becomes
-- visible. Deliberately no UNIQUE (kind, idempotency_key): showing the
-- double effect is the point of the switch.
CREATE TABLE fake_payments.ledger (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text        NOT NULL,
    idempotency_key text        NOT NULL,
    policy_id       bigint,
    booking_id      bigint,
    -- a refund of a charge names it
    charge_key      text,
    amount_cents    bigint      NOT NULL,
    -- when the movement takes hold: the request's completes_at, so a slow
    -- request's movement is scheduled at acceptance and counts once due
    applied_at      timestamptz NOT NULL,
    CONSTRAINT ledger_kind_check CHECK (kind IN ('charge', 'refund')),
    CONSTRAINT ledger_amount_check CHECK (amount_cents > 0)
);
-- the ledger report groups by subject; invariants count refunds per policy
CREATE INDEX ledger_policy_id_idx ON fake_payments.ledger (policy_id, kind) WHERE policy_id IS NOT NULL;
CREATE INDEX ledger_booking_id_idx ON fake_payments.ledger (booking_id, kind) WHERE booking_id IS NOT NULL;
-- a key's movements, for tests and for anyone auditing one request
CREATE INDEX ledger_idempotency_key_idx ON fake_payments.ledger (idempotency_key);

-- +goose Down
DROP TABLE fake_payments.ledger;
DROP TABLE fake_payments.refunds;
DROP TABLE fake_payments.charges;
DROP SCHEMA fake_payments;
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fake_provider.truth(outcome text, completes_at timestamptz, at timestamptz)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT CASE
               WHEN outcome = 'REJECTED' THEN 'REJECTED'
               WHEN completes_at <= at THEN 'COMPLETED'
               ELSE 'RUNNING'
           END
$$;
-- +goose StatementEnd
DROP FUNCTION fault.truth(text, timestamptz, timestamptz);
