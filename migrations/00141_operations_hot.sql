-- +goose Up

-- An operation's row changes a few times in each run (its SENT, its
-- status), and each change wrote a new version into every index of the
-- table unless it stayed on its page touching no indexed column (a HOT
-- update). Room on the page: each page is filled to 80 %, so a row's next
-- versions fit beside it. One index fewer to write: operations_stale_idx
-- (the lease of live operations) is served by operations_claimable_idx,
-- which has the same predicate and is what the claim and its lag read
-- (00105).
ALTER TABLE operations SET (fillfactor = 80);
DROP INDEX operations_stale_idx;

-- +goose Down
CREATE INDEX operations_stale_idx ON operations (lease_expires_at)
    WHERE status IN ('IN_PROGRESS', 'RECOVERING');
ALTER TABLE operations RESET (fillfactor);
