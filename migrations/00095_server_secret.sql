-- +goose Up

-- The server secret, for a deployment started without SESSION_SECRET: made
-- once by whichever process asks first and then read by every replica and
-- every restart, so restarting the app (the crash demo) keeps the forms'
-- CSRF tokens and the generated users' API tokens valid. SESSION_SECRET,
-- when set, wins and this row is never read.
CREATE TABLE server_secrets (
    name       text        PRIMARY KEY, -- 'session': one secret per purpose
    value      bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- 256 random bits: an HMAC key no one can guess
    CONSTRAINT server_secrets_value_check CHECK (length(value) = 32)
);

-- +goose Down
DROP TABLE server_secrets;
