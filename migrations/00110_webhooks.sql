-- +goose Up

-- Callbacks (issue 28). The fakes call the app back when a call reaches a
-- state; the app receives each callback once, whatever the copies.

-- How a fake sends its callbacks, one row per system (internal/fault):
-- off (none), ok, duplicate (every event sent twice), delay (each sent
-- delay_ms late: after a status query has been answered), reorder (a
-- RUNNING sent delay_ms after the COMPLETED that followed it), lost
-- (recorded, never sent). No row: off.
CREATE TABLE fault.webhook_settings (
    system     text        PRIMARY KEY,
    mode       text        NOT NULL,
    delay_ms   integer     NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_settings_mode_check CHECK (mode IN ('off', 'ok', 'duplicate', 'delay', 'reorder', 'lost')),
    CONSTRAINT webhook_settings_delay_check CHECK (delay_ms BETWEEN 0 AND 600000)
);

-- Each fake's webhook outbox: one row per copy of an event to send, written
-- in the transaction that processed the call (so a callback exists exactly
-- when its outcome does), sent after commit by the fake's sender, at least
-- once, with backoff. Copies of one event (the duplicate mode) share
-- event_id.
CREATE TABLE fake_provider.webhooks (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text        NOT NULL,
    -- the call reported on: the caller's idempotency key
    idempotency_key text        NOT NULL,
    status          text        NOT NULL,
    reason          text,
    occurred_at     timestamptz NOT NULL,
    -- when the next push is due; while a push is under way, its lease's end
    deliver_after   timestamptz NOT NULL,
    -- the lease of the push under way: its holder's token fences the result
    lease_token     uuid,
    -- the lost mode: recorded, never sent
    lost            boolean     NOT NULL DEFAULT false,
    attempts        integer     NOT NULL DEFAULT 0,
    delivered_at    timestamptz,
    last_status     integer,
    last_error      text,
    CONSTRAINT webhooks_status_check CHECK (status IN ('RUNNING', 'COMPLETED', 'REJECTED'))
);
-- the sender's claim: due copies not yet delivered
CREATE INDEX webhooks_due_idx ON fake_provider.webhooks (deliver_after) WHERE delivered_at IS NULL AND NOT lost;

CREATE TABLE fake_payments.webhooks (LIKE fake_provider.webhooks INCLUDING ALL);

-- The app's inbox of callbacks: one row per event received, written in the
-- transaction of its effect (internal/workflow/callback.go), so a copy of
-- an event already received changes nothing but the duplicates count.
CREATE TABLE webhook_inbox (
    system       text        NOT NULL,
    event_id     text        NOT NULL,
    step_key     text        NOT NULL,
    -- what the callback said: RUNNING, COMPLETED, REJECTED
    status       text        NOT NULL,
    -- the delivery attempt that got through (the sender's count)
    attempt      integer     NOT NULL,
    -- copies received after the first: each changed nothing
    duplicates   integer     NOT NULL DEFAULT 0,
    received_at  timestamptz NOT NULL DEFAULT now(),
    -- applied: it settled the step · noted: RUNNING, nothing to settle ·
    -- stale: the step's outcome was already known (zero rows changed) ·
    -- unknown_step: no step has the key; kept for a person
    outcome      text        NOT NULL,
    -- no foreign key: an operation purged later leaves its callbacks here
    operation_id bigint,
    detail       text        NOT NULL DEFAULT '',
    -- one effect per event: a redelivery finds the row and stops
    CONSTRAINT webhook_inbox_pkey PRIMARY KEY (system, event_id),
    CONSTRAINT webhook_inbox_status_check CHECK (status IN ('RUNNING', 'COMPLETED', 'REJECTED')),
    CONSTRAINT webhook_inbox_outcome_check CHECK (outcome IN ('applied', 'noted', 'stale', 'unknown_step'))
);
-- the operation page lists an operation's callbacks
CREATE INDEX webhook_inbox_operation_idx ON webhook_inbox (operation_id) WHERE operation_id IS NOT NULL;
-- the Provider page lists the callbacks kept for a person
CREATE INDEX webhook_inbox_unknown_idx ON webhook_inbox (received_at) WHERE outcome = 'unknown_step';

-- +goose Down
DROP TABLE webhook_inbox;
DROP TABLE fake_payments.webhooks;
DROP TABLE fake_provider.webhooks;
DROP TABLE fault.webhook_settings;
