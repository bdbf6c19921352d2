-- +goose Up

-- The fake provider's own durable state, kept as another company's system would
-- keep it: in its own schema, with no foreign keys into idemlab's tables (it
-- knows policies only by the id the caller sends). Its truth therefore survives
-- a crash of the app, and several app replicas talking to one provider see one
-- truth. See internal/provider/fake/doc.go.
CREATE SCHEMA fake_provider;

-- One row per provider idempotency key the provider has processed. A key with
-- no row is NOT_STARTED. The truth of a key is computed when it is read, never
-- stored, so RUNNING turns into COMPLETED by time with no background process:
--   outcome = 'REJECTED'                      → REJECTED
--   outcome = 'ACCEPTED' and completes_at > now  → RUNNING
--   outcome = 'ACCEPTED' and completes_at <= now → COMPLETED
CREATE TABLE fake_provider.requests (
    idempotency_key  text        NOT NULL,
    policy_id        bigint      NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    outcome          text        NOT NULL,
    -- why the provider refused; set exactly when outcome is REJECTED
    reject_reason    text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    -- when an ACCEPTED request finishes: received_at for ok and lost_response,
    -- received_at + slow_ms for slow
    completes_at     timestamptz NOT NULL,
    -- how many calls with this key were processed (repeats included)
    attempts         integer     NOT NULL DEFAULT 1,
    last_received_at timestamptz NOT NULL DEFAULT now(),
    -- The provider's own idempotency: one row per key. A concurrent duplicate's
    -- INSERT … ON CONFLICT waits for the first to commit and then sees its row,
    -- so an idempotent provider applies one effect however many copies race.
    CONSTRAINT requests_pkey PRIMARY KEY (idempotency_key),
    CONSTRAINT requests_outcome_check CHECK (outcome IN ('ACCEPTED', 'REJECTED')),
    CONSTRAINT requests_reject_reason_check CHECK ((outcome = 'REJECTED') = (reject_reason IS NOT NULL)),
    CONSTRAINT requests_attempts_check CHECK (attempts >= 1)
);

-- The one definition of a key's truth, used by every read: REJECTED stays
-- REJECTED; an ACCEPTED request is RUNNING until completes_at, COMPLETED from
-- then on. `at` is the database clock (now()) except in tests that move time.
-- +goose StatementBegin
CREATE FUNCTION fake_provider.truth(outcome text, completes_at timestamptz, at timestamptz)
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

-- The effects ledger: one row per cancellation the provider actually carried
-- out. An idempotent provider writes at most one row per key; a non-idempotent
-- one writes a row per processed call, which is how a double effect becomes
-- visible. Deliberately no UNIQUE (idempotency_key): showing the double effect
-- is the point of the non-idempotent switch.
CREATE TABLE fake_provider.effects (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL,
    policy_id       bigint      NOT NULL,
    -- when the effect takes hold: the request's completes_at, so a slow
    -- request's effect is scheduled at acceptance and counts once it is due
    applied_at      timestamptz NOT NULL
);
-- the effects report groups by policy
CREATE INDEX effects_policy_id_idx ON fake_provider.effects (policy_id, applied_at);
-- a key's effects, for the tests and for anyone auditing one request
CREATE INDEX effects_idempotency_key_idx ON fake_provider.effects (idempotency_key);

-- Fault configuration, in the database so it survives restarts and is shared by
-- every app replica talking to this provider. policy_id NULL is the global
-- default; a number overrides it for that policy.
CREATE TABLE fake_provider.faults (
    policy_id   bigint,
    mode        text        NOT NULL,
    idempotent  boolean     NOT NULL,
    slow_ms     integer     NOT NULL,
    latency_ms  integer     NOT NULL,
    -- how status queries fail; only the global row's value is used
    status_mode text        NOT NULL,
    -- flaky: the seed, the weight of each concrete mode, and how many draws
    -- were made, so a seed and a call sequence always give the same outcomes
    seed        bigint      NOT NULL,
    weights     jsonb       NOT NULL,
    draws       bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- one global row (NULL counts as a value here) and one row per overridden policy
    CONSTRAINT faults_policy_id_key UNIQUE NULLS NOT DISTINCT (policy_id),
    CONSTRAINT faults_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT faults_status_mode_check CHECK (status_mode IN ('ok', 'error', 'drop')),
    CONSTRAINT faults_durations_check CHECK (slow_ms >= 0 AND latency_ms >= 0)
);

-- The script: faults for the next N calls, consumed in id order before any
-- override or the global default. policy_id NULL matches every call.
CREATE TABLE fake_provider.fault_script (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    policy_id   bigint,
    mode        text        NOT NULL,
    idempotent  boolean     NOT NULL,
    slow_ms     integer     NOT NULL,
    latency_ms  integer     NOT NULL,
    seed        bigint      NOT NULL,
    weights     jsonb       NOT NULL,
    draws       bigint      NOT NULL DEFAULT 0,
    -- calls this entry still applies to; an entry at 0 is deleted
    remaining   integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fault_script_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT fault_script_durations_check CHECK (slow_ms >= 0 AND latency_ms >= 0),
    CONSTRAINT fault_script_remaining_check CHECK (remaining >= 0)
);

-- A provider starts healthy and idempotent.
INSERT INTO fake_provider.faults (policy_id, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights)
VALUES (NULL, 'ok', true, 5000, 0, 'ok', 1,
        '{"ok": 4, "reject": 0, "error": 2, "drop": 1, "lost_response": 2, "slow": 1}');

-- +goose Down
DROP TABLE fake_provider.fault_script;
DROP TABLE fake_provider.faults;
DROP TABLE fake_provider.effects;
DROP FUNCTION fake_provider.truth(text, timestamptz, timestamptz);
DROP TABLE fake_provider.requests;
DROP SCHEMA fake_provider;
