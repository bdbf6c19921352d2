-- +goose Up

-- Browser sessions, kept on the server so that signing out ends one for
-- every replica at once. The cookie holds 256 random bits; only their
-- SHA-256 is stored, so a copy of this table signs no one in. A new row at
-- every sign-in (the id is never reused), deleted at sign-out, looked up on
-- every request that carries the cookie.
CREATE TABLE sessions (
    id_sha256  bytea       PRIMARY KEY,
    -- a user's sessions go with the user (a data reset recreates users)
    user_id    bigint      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT sessions_expiry_check CHECK (expires_at > created_at)
);
-- sign-in sweeps the user's expired sessions: find them by user
CREATE INDEX sessions_user_id_idx ON sessions (user_id, expires_at);

-- +goose Down
DROP TABLE sessions;
