-- +goose Up

-- The rate limits' token buckets, shared by every replica: behind N
-- replicas a client still gets the documented rate, not N times it
-- (internal/web/ratelimit.go). One row per limit and key (an address or a
-- user); the bucket holds `tokens` as of `at`, and refills continuously.
--
-- UNLOGGED: the buckets write no write-ahead log, so a request's take
-- commits without waiting for a flush to disk or for a synchronous standby —
-- a limit costs a round trip, not a commit. The price: a crash or a failover
-- empties the table, and every client starts with a full bucket. A limit
-- stops a flood; it is not a quota, and a fresh burst after a crash is
-- harmless.
CREATE UNLOGGED TABLE rate_buckets (
    limit_name text             NOT NULL, -- 'sign-in', 'writes-per-user', …
    key        text             NOT NULL, -- 'addr:…' or 'user:…'
    tokens     double precision NOT NULL,
    at         timestamptz      NOT NULL,
    -- whether the latest take got a token: what the statement answers
    taken      boolean          NOT NULL,
    -- one bucket per limit and key: concurrent takes queue on its row
    PRIMARY KEY (limit_name, key)
);

-- +goose Down
DROP TABLE rate_buckets;
