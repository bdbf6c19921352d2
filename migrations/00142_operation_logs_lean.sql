-- +goose Up

-- The two logs of an operation — its timeline (operation_events) and its
-- exchanges with other systems (operation_calls) — are appended by the
-- engine only, in the transaction that holds the operation's row lock as
-- its owner (the fence), with the ids of the operation, its steps and its
-- calls that transaction just read or wrote. Their foreign keys checked
-- again what the fence had just established, at an index lookup each —
-- and a FOR KEY SHARE lock each: on the two rows of external_systems every
-- call of every operation shares, a lock recorded in the WAL every time.
-- About 20 checks per cancellation, 80 buffers and 12 WAL records. The
-- logs keep their ids; retention deletes them with their operation
-- (internal/operations).
ALTER TABLE operation_events DROP CONSTRAINT operation_events_operation_id_fkey;
ALTER TABLE operation_calls
    DROP CONSTRAINT operation_calls_operation_id_fkey,
    DROP CONSTRAINT operation_calls_step_key_fkey,
    DROP CONSTRAINT operation_calls_call_id_fkey,
    DROP CONSTRAINT operation_calls_system_fkey;
-- A step names its system as its definition does (workflow.Caller.System);
-- the belief about it is read by name and a missing one is an error there.
-- A run's steps are inserted by the transaction that has just inserted or
-- restarted their operation (workflow.sqlInsertSteps): their foreign key
-- to it re-checked that, six times per cancellation.
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_system_fkey,
    DROP CONSTRAINT operation_steps_operation_id_fkey;

-- The calls are read by operation (the page, the desk: operation_idx);
-- the index by step key went (one entry fewer per call, four per
-- cancellation).
DROP INDEX operation_calls_step_key_idx;

-- The timeline is read by operation, in order: that index is its key, and
-- the one on id alone went (one index entry fewer per line).
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey;
DROP INDEX operation_events_operation_idx;
ALTER TABLE operation_events ADD PRIMARY KEY (operation_id, id);

-- A step is found by its name in its run; its position orders the run and
-- is laid out once, from the definition, by the insert that writes every
-- step of the run (workflow.sqlInsertSteps). One unique index serves both:
-- the name's is the key, the position's went (one index entry fewer per
-- step, six per cancellation).
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_pkey,
    DROP CONSTRAINT operation_steps_name_key,
    ADD PRIMARY KEY (operation_id, run, name);

-- +goose Down
CREATE INDEX operation_calls_step_key_idx ON operation_calls (step_key, id);
ALTER TABLE operation_steps ADD CONSTRAINT operation_steps_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations (id);
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_pkey,
    ADD PRIMARY KEY (operation_id, run, position),
    ADD CONSTRAINT operation_steps_name_key UNIQUE (operation_id, run, name);
ALTER TABLE operation_events DROP CONSTRAINT operation_events_pkey;
ALTER TABLE operation_events ADD PRIMARY KEY (id);
CREATE INDEX operation_events_operation_idx ON operation_events (operation_id, id);
ALTER TABLE operation_steps ADD CONSTRAINT operation_steps_system_fkey FOREIGN KEY (system) REFERENCES external_systems (name);
ALTER TABLE operation_calls
    ADD CONSTRAINT operation_calls_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations (id),
    ADD CONSTRAINT operation_calls_step_key_fkey FOREIGN KEY (step_key) REFERENCES operation_steps (step_key),
    ADD CONSTRAINT operation_calls_call_id_fkey FOREIGN KEY (call_id) REFERENCES operation_calls (id),
    ADD CONSTRAINT operation_calls_system_fkey FOREIGN KEY (system) REFERENCES external_systems (name);
ALTER TABLE operation_events ADD CONSTRAINT operation_events_operation_id_fkey FOREIGN KEY (operation_id) REFERENCES operations (id);
