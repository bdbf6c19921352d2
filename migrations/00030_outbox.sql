-- +goose Up

-- Events (internal/events, docs/events.md). An event is a row of the outbox,
-- written in the business transaction that makes the change it describes, so
-- the change and the news of it commit together or not at all: no dual write.
-- A relay (NATS JetStream, later Kafka and the task queue) hands PENDING rows
-- to a transport; with River the job is inserted in the same transaction and
-- the row is SENT at once. Consumers record each event they apply in their
-- inbox, in the same transaction as the effect.

-- Which transport this database's events travel on. One row, set by the app
-- at start from EVENTS_TRANSPORT; events.Write reads it in the writer's
-- transaction, so every replica writes rows the same relay will pick up.
CREATE TABLE events_config (
    one        boolean     NOT NULL DEFAULT true,
    transport  text        NOT NULL DEFAULT 'nats',
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- exactly one row
    CONSTRAINT events_config_pkey PRIMARY KEY (one),
    CONSTRAINT events_config_one_check CHECK (one),
    CONSTRAINT events_config_transport_check CHECK (transport IN ('nats', 'river', 'kafka', 'tasks'))
);
INSERT INTO events_config DEFAULT VALUES;

-- The outbox: PENDING (waiting for the relay) → SENT (the transport has it:
-- published and acknowledged, or enqueued in the writer's commit) | DEAD
-- (failed to publish max-attempts times; a person replays it).
CREATE TABLE outbox (
    -- The producer's event id (a UUID it assigns). The one identity every
    -- consumer dedupes on, and the Nats-Msg-Id / record key / task name the
    -- transports carry. Never the transport's own offset or delivery id.
    id              uuid        NOT NULL,
    -- what happened: policy.cancelled, booking.confirmed, booking.released, …
    type            text        NOT NULL,
    -- the aggregate it happened to: "policy:42", "booking:7"
    key             text        NOT NULL,
    payload         jsonb       NOT NULL,
    transport       text        NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING',
    -- publish attempts that failed or were made (the relay's count)
    attempts        integer     NOT NULL DEFAULT 0,
    -- The relay's claim: a PENDING row is due when next_attempt_at has
    -- passed. Claiming moves it into the future by the claim's lease, so
    -- other relays skip it while this one publishes; claim_token fences the
    -- mark that follows (a relay whose lease ran out marks nothing).
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claim_token     uuid,
    last_error      text,
    -- clock_timestamp(): when the writer wrote it, for the lag figures
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at         timestamptz,
    -- one row per event: a producer that writes the same id twice is refused
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_status_check CHECK (status IN ('PENDING', 'SENT', 'DEAD')),
    -- SENT exactly when it has a sent_at: the retention scan relies on it
    CONSTRAINT outbox_sent_check CHECK ((status = 'SENT') = (sent_at IS NOT NULL)),
    CONSTRAINT outbox_transport_check CHECK (transport IN ('nats', 'river', 'kafka', 'tasks')),
    CONSTRAINT outbox_type_check CHECK (type ~ '^[a-z]+(\.[a-z_]+)+$'),
    CONSTRAINT outbox_key_check CHECK (key ~ '^[a-z_]+:.+$'),
    CONSTRAINT outbox_attempts_check CHECK (attempts >= 0)
);
-- The relay's claim: due PENDING rows of its transport, oldest due first.
-- Partial, so it stays small however many SENT rows are kept.
CREATE INDEX outbox_pending_idx ON outbox (transport, next_attempt_at) WHERE status = 'PENDING';
-- The retention scan: SENT rows past their keep time, oldest first.
CREATE INDEX outbox_sent_idx ON outbox (sent_at) WHERE status = 'SENT';
-- The dead letters a person looks at.
CREATE INDEX outbox_dead_idx ON outbox (created_at) WHERE status = 'DEAD';
-- The Events page lists the newest events first.
CREATE INDEX outbox_created_at_idx ON outbox (created_at);

-- Every publish the relay made and what the broker said: duplicate = the
-- broker already had this event id inside its dedupe window and dropped the
-- copy (the broker layer caught a duplicate). Append-only, for the Events page.
CREATE TABLE event_publishes (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id  uuid        NOT NULL,
    transport text        NOT NULL,
    instance  text        NOT NULL,
    duplicate boolean     NOT NULL,
    -- the injector mode that caused this publish, if any
    injected  text,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX event_publishes_event_idx ON event_publishes (event_id, id);
CREATE INDEX event_publishes_at_idx ON event_publishes (at);

-- The consumers' inbox: one row per (consumer, event) applied. Inserted with
-- ON CONFLICT DO NOTHING in the same transaction as the consumer's effect:
-- a new row means "apply it", no row means "applied already". Kept longer
-- than any transport can redeliver (EVENTS_INBOX_RETENTION), and never
-- together with the outbox row: a redelivery after the outbox forgot the
-- event must still be recognised.
CREATE TABLE inbox (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    -- the consumer rule's guard: one effect per event and consumer
    CONSTRAINT inbox_pkey PRIMARY KEY (consumer, event_id)
);
CREATE INDEX inbox_applied_at_idx ON inbox (applied_at);

-- Every delivery a consumer saw and what it did with it: applied, duplicate
-- (the inbox already had it: caught_by = 'inbox'), deferred (sent back
-- unhandled), failed. Written in the consumer's own transaction where there
-- is one. Append-only, for the Events page and the tests.
CREATE TABLE event_deliveries (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id  uuid        NOT NULL,
    consumer  text        NOT NULL,
    transport text        NOT NULL,
    instance  text        NOT NULL,
    -- the transport's own count for this delivery (informational only:
    -- never what dedupes)
    attempt   integer     NOT NULL,
    outcome   text        NOT NULL,
    caught_by text,
    injected  text,
    detail    text        NOT NULL DEFAULT '',
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT event_deliveries_outcome_check CHECK (outcome IN ('applied', 'duplicate', 'deferred', 'failed'))
);
CREATE INDEX event_deliveries_event_idx ON event_deliveries (event_id, id);
CREATE INDEX event_deliveries_at_idx ON event_deliveries (at);

-- The notifications consumer's effect: the customer's messages, shown in the
-- UI. event_id is deliberately not UNIQUE: the inbox is what keeps one
-- message per event, and the invariants check that it did.
CREATE TABLE mailbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id    bigint      NOT NULL REFERENCES users (id),
    event_id   uuid        NOT NULL,
    subject    text        NOT NULL,
    body       text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mailbox_user_idx ON mailbox (user_id, id);
CREATE INDEX mailbox_event_idx ON mailbox (event_id);

-- The ledger consumer's effect: one journal line per event applied, and the
-- per-day projection the lines add up to (updated in the same transaction).
-- Like the mailbox, no UNIQUE (event_id): the inbox keeps it to one.
CREATE TABLE ledger_entries (
    id         bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id   uuid          NOT NULL,
    day        date          NOT NULL,
    kind       text          NOT NULL,
    amount     numeric(12,2) NOT NULL DEFAULT 0,
    created_at timestamptz   NOT NULL DEFAULT now(),
    CONSTRAINT ledger_entries_kind_check CHECK (kind IN ('cancellation', 'booking_confirmed', 'booking_released'))
);
CREATE INDEX ledger_entries_event_idx ON ledger_entries (event_id);
CREATE INDEX ledger_entries_day_idx ON ledger_entries (day);

CREATE TABLE ledger_days (
    day                date          NOT NULL,
    cancellations      integer       NOT NULL DEFAULT 0,
    refunds            numeric(12,2) NOT NULL DEFAULT 0,
    bookings_confirmed integer       NOT NULL DEFAULT 0,
    bookings_released  integer       NOT NULL DEFAULT 0,
    updated_at         timestamptz   NOT NULL DEFAULT now(),
    -- one row per day: the projection's upsert relies on it
    CONSTRAINT ledger_days_pkey PRIMARY KEY (day)
);

-- The redelivery injector's script: the next `remaining` deliveries (or
-- publishes) get `mode`, in id order; consumer NULL matches every consumer.
-- In the database so every replica sees the same script.
CREATE TABLE event_injections (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    mode       text        NOT NULL,
    consumer   text,
    remaining  integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT event_injections_mode_check CHECK (mode IN
        ('deliver_twice', 'fail_after_commit', 'lose_ack', 'out_of_order', 'hold_past_deadline', 'after_window')),
    CONSTRAINT event_injections_remaining_check CHECK (remaining >= 0)
);

-- +goose Down
DROP TABLE event_injections;
DROP TABLE ledger_days;
DROP TABLE ledger_entries;
DROP TABLE mailbox;
DROP TABLE event_deliveries;
DROP TABLE inbox;
DROP TABLE event_publishes;
DROP TABLE outbox;
DROP TABLE events_config;
