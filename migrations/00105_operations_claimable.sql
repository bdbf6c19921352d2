-- +goose Up

-- The recovery loop's claim and its lag (internal/workflow/claim.go): a live
-- operation is claimable once its lease and its backoff are both over, that
-- is from greatest(lease_expires_at, next_attempt_at) (greatest ignores a
-- NULL next_attempt_at). operations_stale_idx orders by the lease alone, so
-- the claim walked past every backed-off row still waiting on its backoff,
-- and the lag — min of that expression — read every live row on each pass
-- (10 ms at 10,000 stale operations, on every pass of a draining loop).
-- Ordered by the expression itself, the claim's first rows are the
-- claimable ones, oldest first, and the lag is the index's first entry.
CREATE INDEX operations_claimable_idx ON operations ((greatest(lease_expires_at, next_attempt_at)))
    WHERE status IN ('IN_PROGRESS', 'RECOVERING');

-- +goose Down
DROP INDEX operations_claimable_idx;
