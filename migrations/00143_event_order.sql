-- +goose Up

-- Per-aggregate order (issue 28, docs/events.md "Order per aggregate"). Every
-- event carries its place in its aggregate's history — policy:42's first
-- event is 1, its second 2 — assigned in the business transaction that
-- writes the outbox row (events.Write), so a consumer that needs order can
-- tell "next", "early" and "seen" apart whatever order a transport hands
-- them over in.

-- The counter of each aggregate: the last place handed out. events.Write
-- upserts it in the writer's transaction; the row lock it takes is held to
-- that transaction's end, so two writers of one aggregate take turns and the
-- places follow their commits, and a rollback hands its place back (no gap
-- a consumer would wait on for ever). Why not max(seq) + 1 over the outbox:
-- two writers read the same max (neither sees the other's uncommitted row),
-- and the relay purges old rows. Why not one global sequence: nextval is
-- taken at write and never handed back, so numbers commit out of order and
-- leave gaps — a consumer could not tell a rollback from an event on its way.
CREATE TABLE outbox_sequences (
    key      text   NOT NULL,
    last_seq bigint NOT NULL,
    CONSTRAINT outbox_sequences_pkey PRIMARY KEY (key),
    CONSTRAINT outbox_sequences_last_seq_check CHECK (last_seq > 0)
);

-- The event's place in its aggregate (1, 2, …). No unique (key, seq) index:
-- the counter's row lock already makes two places impossible, and an index
-- more on the hottest insert costs every event; invariant 10 checks it.
ALTER TABLE outbox ADD COLUMN seq bigint;
-- Rows written before this migration: their order within the aggregate is
-- the order they were written in.
UPDATE outbox o
   SET seq = n.seq
  FROM (SELECT id, row_number() OVER (PARTITION BY key ORDER BY created_at, id) AS seq
          FROM outbox) n
 WHERE o.id = n.id;
INSERT INTO outbox_sequences (key, last_seq)
SELECT key, max(seq)
  FROM outbox
 GROUP BY key;
ALTER TABLE outbox ALTER COLUMN seq SET NOT NULL;
ALTER TABLE outbox ADD CONSTRAINT outbox_seq_check CHECK (seq > 0);

-- The history consumer (internal/events/history.go): a projection that needs
-- order. One row per aggregate: how far its history has been applied, and
-- the state the last applied event left it in.
CREATE TABLE histories (
    key        text        NOT NULL,
    -- the seq of the last event applied; the next one to apply is version + 1
    version    bigint      NOT NULL DEFAULT 0,
    -- what the last applied event says of it: cancelled, held, confirmed, released, hold_released
    state      text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- one row per aggregate; its row lock serialises the deliveries of one aggregate
    CONSTRAINT histories_pkey PRIMARY KEY (key),
    CONSTRAINT histories_version_check CHECK (version >= 0)
);
-- Every event the projection applied, at its place: the fold the projection
-- must equal (invariant 10).
CREATE TABLE history_events (
    key        text        NOT NULL,
    seq        bigint      NOT NULL,
    event_id   uuid        NOT NULL,
    type       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- when it arrived early and was parked; NULL when it came in its turn
    parked_at  timestamptz,
    -- one event per place: a second event at the same place is refused
    CONSTRAINT history_events_pkey PRIMARY KEY (key, seq)
);
-- Early events: arrived before their predecessor, kept (not applied, not
-- dropped) until the predecessor is applied; then applied in order and
-- deleted, in that transaction.
CREATE TABLE history_parked (
    key        text        NOT NULL,
    seq        bigint      NOT NULL,
    event_id   uuid        NOT NULL,
    type       text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    parked_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- one parked event per place: a copy of a parked event is refused
    CONSTRAINT history_parked_pkey PRIMARY KEY (key, seq)
);

-- The ordering lab (internal/labs/ordering.go) runs the history consumer on
-- the labs schema unchanged: the same three tables there, scratch rows keyed
-- by names that carry the run.
CREATE TABLE labs.histories (LIKE histories INCLUDING ALL);
CREATE TABLE labs.history_events (LIKE history_events INCLUDING ALL);
CREATE TABLE labs.history_parked (LIKE history_parked INCLUDING ALL);

-- +goose Down
DROP TABLE labs.history_parked;
DROP TABLE labs.history_events;
DROP TABLE labs.histories;
DROP TABLE history_parked;
DROP TABLE history_events;
DROP TABLE histories;
ALTER TABLE outbox DROP COLUMN seq;
DROP TABLE outbox_sequences;
