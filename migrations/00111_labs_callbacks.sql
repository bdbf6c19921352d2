-- +goose Up

-- The webhooks lab (internal/labs/callbacks.go): one step per variant, the
-- callbacks' inbox, and the refunds settling the step leads to. Scratch
-- rows of a run, deleted when it ends.
CREATE TABLE labs.callback_steps (
    run_id  bigint NOT NULL,
    variant text   NOT NULL,
    -- SENT (in flight), RUNNING, DONE
    state   text   NOT NULL,
    CONSTRAINT callback_steps_pkey PRIMARY KEY (run_id, variant)
);
CREATE TABLE labs.callback_inbox (
    run_id   bigint NOT NULL,
    variant  text   NOT NULL,
    event_id text   NOT NULL,
    -- one effect per event: a copy finds the row and stops
    CONSTRAINT callback_inbox_pkey PRIMARY KEY (run_id, variant, event_id)
);
CREATE TABLE labs.callback_effects (
    run_id  bigint NOT NULL,
    variant text   NOT NULL,
    -- who settled the step and so made the refund: recovery, or an event id
    by      text   NOT NULL
);
CREATE INDEX callback_effects_run_idx ON labs.callback_effects (run_id, variant);

-- +goose Down
DROP TABLE labs.callback_effects;
DROP TABLE labs.callback_inbox;
DROP TABLE labs.callback_steps;
