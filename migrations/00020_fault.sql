-- +goose Up

-- The fault machinery every fake shares (internal/fault): what each fake is
-- told to do to the calls it receives, and the late arrivals it refused. One
-- schema for all fakes, a row's `system` naming the fake ('provider',
-- 'payments'), so one set of SQL serves them all; each fake's business state
-- (requests, effects, charges, refunds) stays in its own schema. The
-- provider's faults move here from fake_provider.faults and fault_script.
CREATE SCHEMA fault;

-- The standing settings: per system, one global row (subject NULL) and one
-- override per subject ('policy:7', 'booking:3').
CREATE TABLE fault.settings (
    system      text        NOT NULL,
    subject     text,
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
    -- one global row per system (a NULL subject counts as a value here) and
    -- one row per overridden subject
    CONSTRAINT settings_scope_key UNIQUE NULLS NOT DISTINCT (system, subject),
    CONSTRAINT settings_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT settings_status_mode_check CHECK (status_mode IN ('ok', 'error', 'drop')),
    -- the bounds internal/fault validates, kept here too: no row can hold a
    -- duration the fakes would choke on
    CONSTRAINT settings_bounds_check CHECK (slow_ms BETWEEN 0 AND 600000
                                            AND latency_ms BETWEEN 0 AND 60000
                                            AND seed BETWEEN 0 AND 9007199254740991)
);

-- The script: faults for the next N calls, consumed in id order before any
-- override or the global setting. A NULL subject matches every call.
CREATE TABLE fault.script (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    system      text        NOT NULL,
    subject     text,
    mode        text        NOT NULL,
    idempotent  boolean     NOT NULL,
    slow_ms     integer     NOT NULL,
    latency_ms  integer     NOT NULL,
    seed        bigint      NOT NULL,
    weights     jsonb       NOT NULL,
    draws       bigint      NOT NULL DEFAULT 0,
    -- calls this entry still applies to; an entry at 0 is spent (cleared by the next Set or reset)
    remaining   integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT script_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT script_bounds_check CHECK (slow_ms BETWEEN 0 AND 600000
                                          AND latency_ms BETWEEN 0 AND 60000
                                          AND seed BETWEEN 0 AND 9007199254740991),
    CONSTRAINT script_remaining_check CHECK (remaining BETWEEN 0 AND 10000)
);
-- every call looks for its system's head entry
CREATE INDEX script_system_id_idx ON fault.script (system, id) WHERE remaining > 0;

-- Calls refused because they arrived after their Request-Deadline: nothing
-- was applied, and this row is the durable, visible evidence ("arrived 1.3 s
-- after its deadline"). Judged by the database clock when the whole request
-- had been read.
CREATE TABLE fault.late_arrivals (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    system          text        NOT NULL,
    idempotency_key text        NOT NULL,
    subject         text,
    deadline        timestamptz NOT NULL,
    arrived_at      timestamptz NOT NULL,
    -- a row is a refusal: it exists only for a call that was late
    CONSTRAINT late_arrivals_late_check CHECK (arrived_at > deadline)
);
-- the ledger lists a system's newest refusals
CREATE INDEX late_arrivals_system_id_idx ON fault.late_arrivals (system, id);

-- The provider's faults, moved as they are.
INSERT INTO fault.settings (system, subject, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights, draws, updated_at)
SELECT 'provider', CASE WHEN policy_id IS NULL THEN NULL ELSE 'policy:' || policy_id END,
       mode, idempotent, least(slow_ms, 600000), least(latency_ms, 60000), status_mode,
       least(greatest(seed, 0), 9007199254740991), weights, draws, updated_at
  FROM fake_provider.faults;
INSERT INTO fault.script (system, subject, mode, idempotent, slow_ms, latency_ms, seed, weights, draws, remaining, created_at)
SELECT 'provider', CASE WHEN policy_id IS NULL THEN NULL ELSE 'policy:' || policy_id END,
       mode, idempotent, least(slow_ms, 600000), least(latency_ms, 60000),
       least(greatest(seed, 0), 9007199254740991), weights, draws, least(remaining, 10000), created_at
  FROM fake_provider.fault_script
 ORDER BY id;
DROP TABLE fake_provider.fault_script;
DROP TABLE fake_provider.faults;

-- Every fake starts healthy and idempotent (fault.Default).
INSERT INTO fault.settings (system, subject, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights)
VALUES ('payments', NULL, 'ok', true, 5000, 0, 'ok', 1,
        '{"ok": 4, "reject": 0, "error": 2, "drop": 1, "lost_response": 2, "slow": 1}'),
       ('provider', NULL, 'ok', true, 5000, 0, 'ok', 1,
        '{"ok": 4, "reject": 0, "error": 2, "drop": 1, "lost_response": 2, "slow": 1}')
-- the provider's global row moved above
ON CONFLICT (system, subject) DO NOTHING;

-- +goose Down
CREATE TABLE fake_provider.faults (
    policy_id   bigint,
    mode        text        NOT NULL,
    idempotent  boolean     NOT NULL,
    slow_ms     integer     NOT NULL,
    latency_ms  integer     NOT NULL,
    status_mode text        NOT NULL,
    seed        bigint      NOT NULL,
    weights     jsonb       NOT NULL,
    draws       bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT faults_policy_id_key UNIQUE NULLS NOT DISTINCT (policy_id),
    CONSTRAINT faults_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT faults_status_mode_check CHECK (status_mode IN ('ok', 'error', 'drop')),
    CONSTRAINT faults_durations_check CHECK (slow_ms >= 0 AND latency_ms >= 0)
);
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
    remaining   integer     NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fault_script_mode_check CHECK (mode IN ('ok', 'reject', 'error', 'drop', 'lost_response', 'slow', 'flaky')),
    CONSTRAINT fault_script_durations_check CHECK (slow_ms >= 0 AND latency_ms >= 0),
    CONSTRAINT fault_script_remaining_check CHECK (remaining >= 0)
);
INSERT INTO fake_provider.faults (policy_id, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights, draws, updated_at)
SELECT CASE WHEN subject IS NULL THEN NULL ELSE split_part(subject, ':', 2)::bigint END,
       mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights, draws, updated_at
  FROM fault.settings
 WHERE system = 'provider'
   AND (subject IS NULL OR subject LIKE 'policy:%');
INSERT INTO fake_provider.fault_script (policy_id, mode, idempotent, slow_ms, latency_ms, seed, weights, draws, remaining, created_at)
SELECT CASE WHEN subject IS NULL THEN NULL ELSE split_part(subject, ':', 2)::bigint END,
       mode, idempotent, slow_ms, latency_ms, seed, weights, draws, remaining, created_at
  FROM fault.script
 WHERE system = 'provider'
   AND (subject IS NULL OR subject LIKE 'policy:%')
 ORDER BY id;
DROP TABLE fault.late_arrivals;
DROP TABLE fault.script;
DROP TABLE fault.settings;
DROP SCHEMA fault;
