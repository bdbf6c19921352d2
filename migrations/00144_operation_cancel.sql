-- +goose Up

-- Cancelling a live operation (internal/workflow/cancel.go). A person's
-- request to cancel is a mark on the operation, not a transition: the
-- owner sees it before its next step (the step writes' fence reads it) and
-- stops there. A step already SENT is not undone by the mark; its truth is
-- still learned, and then the workflow compensates or a person decides.
ALTER TABLE operations
    ADD COLUMN cancel_requested_at timestamptz,
    -- who asked, for the page and the timeline (the audit trail has the rest)
    ADD COLUMN cancel_requested_by text,
    -- set together or not at all
    ADD CONSTRAINT operations_cancel_requested_check CHECK ((cancel_requested_at IS NULL) = (cancel_requested_by IS NULL));

-- CANCELLED: a step the operation never ran because it was cancelled before
-- it (never sent, so no call can be on its way). Neither finished nor in
-- flight.
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_state_check,
    ADD CONSTRAINT operation_steps_state_check CHECK (state IN ('PENDING', 'SENT', 'DONE', 'FAILED', 'UNKNOWN', 'CANCELLED')),
    DROP CONSTRAINT operation_steps_local_check,
    ADD CONSTRAINT operation_steps_local_check CHECK (system IS NOT NULL OR state IN ('PENDING', 'DONE', 'FAILED', 'CANCELLED'));

-- The audit trail of a person's actions on an operation is the desk's: a
-- cancel request and a retry from a step are written there too, in the
-- transaction that applies them.
ALTER TABLE reconciliation_decisions
    DROP CONSTRAINT reconciliation_decisions_decision_check,
    ADD CONSTRAINT reconciliation_decisions_decision_check CHECK (decision IN ('mark_done', 'retry', 'mark_failed', 'cancel', 'retry_from'));

-- +goose Down
DELETE FROM reconciliation_decisions WHERE decision IN ('cancel', 'retry_from');
ALTER TABLE reconciliation_decisions
    DROP CONSTRAINT reconciliation_decisions_decision_check,
    ADD CONSTRAINT reconciliation_decisions_decision_check CHECK (decision IN ('mark_done', 'retry', 'mark_failed'));
UPDATE operation_steps SET state = 'PENDING' WHERE state = 'CANCELLED';
ALTER TABLE operation_steps
    DROP CONSTRAINT operation_steps_local_check,
    ADD CONSTRAINT operation_steps_local_check CHECK (system IS NOT NULL OR state IN ('PENDING', 'DONE', 'FAILED')),
    DROP CONSTRAINT operation_steps_state_check,
    ADD CONSTRAINT operation_steps_state_check CHECK (state IN ('PENDING', 'SENT', 'DONE', 'FAILED', 'UNKNOWN'));
ALTER TABLE operations
    DROP CONSTRAINT operations_cancel_requested_check,
    DROP COLUMN cancel_requested_by,
    DROP COLUMN cancel_requested_at;
