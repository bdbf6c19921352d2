-- +goose Up

-- Which branch of the recovery decision tree an event belongs to
-- (claimed, completed, rejected, not_started_retry, poll, retry,
-- backoff, reconciliation, resolved…), so the recovery page can list recent
-- recoveries without parsing prose. NULL for events written by requests.
ALTER TABLE operation_events ADD COLUMN branch text;

-- the recovery page's "recent recoveries": newest branch events first
CREATE INDEX operation_events_branch_idx ON operation_events (id DESC)
    WHERE branch IS NOT NULL;

-- the reconciliation page lists the operations that need a person
CREATE INDEX policy_operations_reconcile_idx ON policy_operations (updated_at)
    WHERE status = 'NEEDS_RECONCILIATION';

-- +goose Down
DROP INDEX policy_operations_reconcile_idx;
DROP INDEX operation_events_branch_idx;
ALTER TABLE operation_events DROP COLUMN branch;
