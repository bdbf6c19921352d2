-- +goose Up

-- The operations list (internal/operations, GET /api/v1/operations). Its
-- default view — every operation, newest first — is the primary key read
-- backwards, and a customer's is operations_user_idx (user_id, id) read
-- backwards: neither needs a new index. What does is the count of FAILED
-- operations at the top of the list and the FAILED filter: FAILED rows are
-- few among many SUCCEEDED ones, so without an index both read the whole
-- table. A partial index holds only the FAILED rows: every other update of
-- an operation evaluates its predicate and writes nothing to it, so a step
-- write costs what it cost before. (The live statuses have
-- operations_stale_idx, NEEDS_RECONCILIATION operations_reconcile_idx;
-- SUCCEEDED is most rows, and its count stops at the list's cap.)
CREATE INDEX operations_failed_idx ON operations (id) WHERE status = 'FAILED';

-- +goose Down
DROP INDEX operations_failed_idx;
