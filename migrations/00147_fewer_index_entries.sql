-- Fewer index entries per cancellation (issue 24, item 9): each index entry
-- a row gets is a WAL record of its own. Four indexes gave entries that
-- nothing reads or that another index already guarantees — 14 WAL records
-- of the 119 a cancellation wrote (docs/performance.md).

-- +goose Up

-- A step's key is derived from what the step is (workflow.StepKey):
-- {operation}:{step}, plus :{run} after run 1 — the run that did it, for a
-- retry's carried copy (carried_from_run). The check says so, and with the
-- primary key (operation_id, run, name) it keeps one key per step that a run
-- does itself, as the unique index on step_key did, without an entry of its
-- own for every step (six per cancellation). A key is found by its operation
-- (its leading number: the engine's callback), then among that operation's
-- steps. A name holds no ':', so no two steps can spell the same key.
ALTER TABLE operation_steps ADD CONSTRAINT operation_steps_key_check CHECK (
    position(':' IN name) = 0
    AND step_key = operation_id || ':' || name
                   || CASE WHEN coalesce(carried_from_run, run) > 1 THEN ':' || coalesce(carried_from_run, run) ELSE '' END);
DROP INDEX operation_steps_step_key_key;

-- The calls are read by operation, in order: that index is their key (the
-- one on id alone went, one entry fewer per call). A decision that cites
-- the status query it saw names it within its own operation.
ALTER TABLE reconciliation_decisions DROP CONSTRAINT reconciliation_decisions_truth_call_id_fkey;
DROP INDEX reconciliation_decisions_truth_call_idx;
ALTER TABLE operation_calls DROP CONSTRAINT operation_calls_pkey;
DROP INDEX operation_calls_operation_idx;
ALTER TABLE operation_calls ADD PRIMARY KEY (operation_id, id);
-- checked on a purged call through reconciliation_decisions_seen_key (operation_id leads)
ALTER TABLE reconciliation_decisions ADD CONSTRAINT reconciliation_decisions_truth_call_fkey
    FOREIGN KEY (operation_id, truth_call_id) REFERENCES operation_calls (operation_id, id);
-- An answer's call (call_id) is read with its operation's calls; the index
-- served the foreign key that 00142 dropped (one entry per answer).
DROP INDEX operation_calls_call_id_idx;

-- One operation of each type per booking: the booking's operations only
-- (a policy's have no booking, and gave the index a NULL entry each, on
-- insert and again at every status change). The same index finds a
-- booking's operations (operations_booking_idx went).
ALTER TABLE operations DROP CONSTRAINT operations_booking_type_key;
DROP INDEX operations_booking_idx;
CREATE UNIQUE INDEX operations_booking_type_key ON operations (booking_id, operation_type) WHERE booking_id IS NOT NULL;

-- +goose Down
DROP INDEX operations_booking_type_key;
CREATE INDEX operations_booking_idx ON operations (booking_id) WHERE booking_id IS NOT NULL;
ALTER TABLE operations ADD CONSTRAINT operations_booking_type_key UNIQUE (booking_id, operation_type);
CREATE INDEX operation_calls_call_id_idx ON operation_calls (call_id) WHERE call_id IS NOT NULL;
ALTER TABLE reconciliation_decisions DROP CONSTRAINT reconciliation_decisions_truth_call_fkey;
ALTER TABLE operation_calls DROP CONSTRAINT operation_calls_pkey;
ALTER TABLE operation_calls ADD PRIMARY KEY (id);
CREATE INDEX operation_calls_operation_idx ON operation_calls (operation_id, id);
CREATE INDEX reconciliation_decisions_truth_call_idx ON reconciliation_decisions (truth_call_id) WHERE truth_call_id IS NOT NULL;
ALTER TABLE reconciliation_decisions ADD CONSTRAINT reconciliation_decisions_truth_call_id_fkey
    FOREIGN KEY (truth_call_id) REFERENCES operation_calls (id);
CREATE UNIQUE INDEX operation_steps_step_key_key ON operation_steps (step_key) WHERE carried_from_run IS NULL;
ALTER TABLE operation_steps DROP CONSTRAINT operation_steps_key_check;
