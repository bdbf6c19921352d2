-- The audit trail keyed by what identifies a line (issue 24, item 9): one
-- line per step key — the audit step writes it once per run — and read by
-- operation (retention purges it with its operation). A step key names its
-- operation first (workflow.StepKey: operation_steps_key_check), so the key
-- (operation_id, step_key) is as unique as step_key alone was, and the one
-- index serves both: two index entries fewer per audit line, which had
-- three (its id, its step key, its operation). The id stays, as a column.

-- +goose Up
ALTER TABLE audit_entries
    DROP CONSTRAINT audit_entries_pkey,
    DROP CONSTRAINT audit_entries_step_key_key,
    -- the step key belongs to the operation it names
    ADD CONSTRAINT audit_entries_step_key_check CHECK (split_part(step_key, ':', 1) = operation_id::text),
    ADD PRIMARY KEY (operation_id, step_key);
DROP INDEX audit_entries_operation_idx;

-- +goose Down
CREATE INDEX audit_entries_operation_idx ON audit_entries (operation_id);
ALTER TABLE audit_entries
    DROP CONSTRAINT audit_entries_pkey,
    DROP CONSTRAINT audit_entries_step_key_check,
    ADD PRIMARY KEY (id),
    ADD CONSTRAINT audit_entries_step_key_key UNIQUE (step_key);
