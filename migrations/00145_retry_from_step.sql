-- +goose Up

-- Retry from a step (internal/workflow/retry.go). A retry is a new run, as
-- a resume is — a step never moves backwards — but the steps before the
-- retried one are not run again: they are carried into the new run as
-- copies, DONE, under the key they were done with, so the run reads whole
-- (the engine, the pages and the invariants read a run's steps) and no
-- call of theirs is ever sent again. carried_from_run names the run that
-- did the step; NULL: this run does it.
ALTER TABLE operation_steps
    ADD COLUMN carried_from_run int,
    ADD CONSTRAINT operation_steps_carried_check CHECK (carried_from_run IS NULL OR state = 'DONE' AND carried_from_run < run);

-- One key, one step that sends it: the copies share their original's key,
-- so the uniqueness is over the steps a run does itself. A partial index
-- cannot back a foreign key: the two that pointed at a step by its key
-- (the audit trail's and the desk's decisions') go, as the logs' did
-- (00142) — each is written in the transaction that has just read or
-- written that step as its owner.
ALTER TABLE audit_entries DROP CONSTRAINT audit_entries_step_key_fkey;
ALTER TABLE reconciliation_decisions DROP CONSTRAINT reconciliation_decisions_step_key_fkey;
ALTER TABLE operation_steps DROP CONSTRAINT operation_steps_step_key_key;
CREATE UNIQUE INDEX operation_steps_step_key_key ON operation_steps (step_key) WHERE carried_from_run IS NULL;

-- +goose Down
DELETE FROM operation_steps WHERE carried_from_run IS NOT NULL;
DROP INDEX operation_steps_step_key_key;
ALTER TABLE operation_steps ADD CONSTRAINT operation_steps_step_key_key UNIQUE (step_key);
ALTER TABLE reconciliation_decisions ADD CONSTRAINT reconciliation_decisions_step_key_fkey FOREIGN KEY (step_key) REFERENCES operation_steps (step_key);
ALTER TABLE audit_entries ADD CONSTRAINT audit_entries_step_key_fkey FOREIGN KEY (step_key) REFERENCES operation_steps (step_key);
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_carried_check,
    DROP COLUMN carried_from_run;
