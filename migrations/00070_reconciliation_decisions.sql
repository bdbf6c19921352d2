-- +goose Up

-- The audit trail of the reconciliation desk: one row per decision a person
-- made on an operation waiting for them, written in the transaction that
-- applies the decision, so it exists exactly when the decision does. It
-- says who decided what, when, on which state and seeing which truth, and
-- why in their words. Nothing here is ever updated.
CREATE TABLE reconciliation_decisions (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id    bigint      NOT NULL REFERENCES operations (id),
    -- the step the decision is about
    step_key        text        NOT NULL REFERENCES operation_steps (step_key),
    at              timestamptz NOT NULL DEFAULT now(),
    -- the person (a user name) and the request that carried the decision
    decided_by      text        NOT NULL,
    actor           text        NOT NULL,
    decision        text        NOT NULL,
    -- the operation's updated_at the person saw: the decision applied only
    -- because the operation was still in that state
    seen_updated_at timestamptz NOT NULL,
    -- the truth the page showed the person (UNKNOWN: no answer)
    truth_seen      text        NOT NULL,
    -- the latest status answer on record when the decision applied (NULL
    -- truth: no answer; NULL call: never asked)
    truth_call_id   bigint      REFERENCES operation_calls (id),
    truth_at_decision text,
    -- what the desk suggested, and whether the decision was one of a batch
    suggested       text        NOT NULL DEFAULT '',
    batch_size      integer     NOT NULL DEFAULT 1,
    note            text        NOT NULL DEFAULT '',
    -- asking again decides nothing, so it is no decision
    CONSTRAINT reconciliation_decisions_decision_check CHECK (decision IN ('mark_done', 'retry', 'mark_failed')),
    -- the last line of defence behind the conditional update: one decision
    -- per state seen, however many admins click at once
    CONSTRAINT reconciliation_decisions_seen_key UNIQUE (operation_id, seen_updated_at)
);
-- the desk lists the newest decisions first
CREATE INDEX reconciliation_decisions_at_idx ON reconciliation_decisions (at DESC, id DESC);

-- +goose Down
DROP TABLE reconciliation_decisions;
