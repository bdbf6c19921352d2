-- +goose Up

-- One row per business intent: "cancel policy P". Request identity (the
-- Idempotency-Key) stops a retried request from running twice; this table's
-- UNIQUE(policy_id, operation_type) stops a double-click that produced two
-- different keys from running twice.
CREATE TABLE policy_operations (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    policy_id        bigint      NOT NULL REFERENCES policies (id),
    operation_type   text        NOT NULL,
    user_id          bigint      NOT NULL REFERENCES users (id),
    -- the request key that started (or last restarted) the operation
    idempotency_key  text        NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    status           text        NOT NULL,
    -- Ownership: whoever holds owner_token until lease_expires_at may write.
    -- Every write by an owner carries AND owner_token = $mine (fencing).
    owner_token      uuid,
    owner_id         text,
    lease_expires_at timestamptz,
    -- A FAILED operation may be started again; each run calls the provider
    -- with its own key, derived from (id, run), so a retry within a run is
    -- the same call and a new run is a new one.
    run              integer     NOT NULL DEFAULT 1,
    provider_key     text        NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    steps            jsonb       NOT NULL DEFAULT '{}',
    provider_truth   text,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    -- business identity: one cancellation per policy, whatever the request keys
    CONSTRAINT policy_operations_policy_type_key UNIQUE (policy_id, operation_type),
    -- one provider call identity per run, so two operations can never share one
    CONSTRAINT policy_operations_provider_key_key UNIQUE (provider_key),
    CONSTRAINT policy_operations_type_check CHECK (operation_type IN ('CANCEL')),
    CONSTRAINT policy_operations_status_check CHECK (status IN
        ('IN_PROGRESS', 'RECOVERING', 'SUCCEEDED', 'FAILED', 'NEEDS_RECONCILIATION')),
    -- an operation someone is working on always has an owner and a lease
    CONSTRAINT policy_operations_owned_check CHECK (
        status NOT IN ('IN_PROGRESS', 'RECOVERING')
        OR (owner_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);
-- the recovery loop's scan: live operations whose lease has run out
CREATE INDEX policy_operations_stale_idx ON policy_operations (lease_expires_at)
    WHERE status IN ('IN_PROGRESS', 'RECOVERING');
CREATE INDEX policy_operations_user_idx ON policy_operations (user_id, id);

-- Append-only timeline of every transition: who (request or recovery worker,
-- and the owner token it held), from → to, and the SQL statement that made it.
CREATE TABLE operation_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id bigint      NOT NULL REFERENCES policy_operations (id),
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_status  text,
    to_status    text        NOT NULL,
    actor        text        NOT NULL,
    owner_token  uuid,
    detail       text        NOT NULL DEFAULT '',
    statement    text        NOT NULL DEFAULT ''
);
CREATE INDEX operation_events_operation_idx ON operation_events (operation_id, id);

-- +goose Down
DROP TABLE operation_events;
DROP TABLE policy_operations;
