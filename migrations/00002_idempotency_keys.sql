-- +goose Up

-- Request-level idempotency keys (internal/idempotency, docs/idempotency.md).
-- One row per (caller, key): absent → IN_PROGRESS (an owner holds a lease) →
-- COMPLETED (the response is stored and replayed byte for byte until purged).
CREATE TABLE idempotency_keys (
    -- the signed-in caller: keys are scoped to them (see the primary key)
    user_id             bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    idempotency_key     text        NOT NULL,
    -- SHA-256 of method, route, path parameters, query and canonical body
    request_fingerprint bytea       NOT NULL,
    status              text        NOT NULL,
    -- the fence: regenerated on every take-over, required by every owner write
    owner_token         uuid        NOT NULL,
    -- while IN_PROGRESS: until then the owner counts as alive
    lease_expires_at    timestamptz NOT NULL,
    -- the stored response (COMPLETED only)
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL,
    completed_at        timestamptz,
    -- after this the janitor may purge the row; a purged key executes afresh
    expires_at          timestamptz NOT NULL,

    -- Who executes is decided here: the claim's INSERT … ON CONFLICT DO NOTHING
    -- succeeds for exactly one request per (caller, key). Scoping by user_id means
    -- one user can never read another's stored response by guessing a key.
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, idempotency_key),
    CONSTRAINT idempotency_keys_status_check CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
    -- COMPLETED if and only if a response is stored: a replay always has something to send
    CONSTRAINT idempotency_keys_completed_has_response_check CHECK (
        (status = 'COMPLETED') = (response_status IS NOT NULL AND response_headers IS NOT NULL
                                  AND response_body IS NOT NULL AND completed_at IS NOT NULL)),
    -- the protocol's key rule (1–255 visible ASCII), also enforced by the middleware
    CONSTRAINT idempotency_keys_key_check CHECK (idempotency_key ~ '^[!-~]{1,255}$'),
    -- a fingerprint is a SHA-256 digest
    CONSTRAINT idempotency_keys_fingerprint_check CHECK (octet_length(request_fingerprint) = 32)
);

-- The janitor's scan: "keys past their retention, oldest first", in bounded batches.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
