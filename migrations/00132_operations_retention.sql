-- +goose Up

-- Retention (internal/operations/retention.go, OPERATIONS_RETENTION): the
-- janitor takes the operations that finished longest ago, SUCCEEDED or
-- FAILED only. A partial index holds just those: a row enters it once, when
-- its operation becomes final, so a step write of a live operation costs
-- nothing more.
CREATE INDEX operations_finished_idx ON operations (finished_at) WHERE status IN ('SUCCEEDED', 'FAILED');

-- Deleting a row checks every foreign key that points at it. Two had no
-- index on their referencing side, so each purged answer and each purged
-- step read a whole table: an answer names its call (operation_calls.call_id;
-- only answers have one, so the index is partial), a decision its step.
CREATE INDEX operation_calls_call_id_idx ON operation_calls (call_id) WHERE call_id IS NOT NULL;
CREATE INDEX reconciliation_decisions_step_key_idx ON reconciliation_decisions (step_key);
CREATE INDEX reconciliation_decisions_truth_call_idx ON reconciliation_decisions (truth_call_id) WHERE truth_call_id IS NOT NULL;

-- +goose Down
DROP INDEX reconciliation_decisions_truth_call_idx;
DROP INDEX reconciliation_decisions_step_key_idx;
DROP INDEX operation_calls_call_id_idx;
DROP INDEX operations_finished_idx;
