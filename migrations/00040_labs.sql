-- +goose Up

-- The labs' own data (internal/labs, docs/labs.md). Each lab runs one
-- scenario twice — broken, then correct — and everything either run writes
-- is here, never in a business table: no lab can touch a customer's policy,
-- key or booking, and no lab's deliberate double effect can show up in the
-- invariants of the real data. Tables that a correct variant shares with
-- the app (idempotency_keys, inbox, external_systems) have the app's shape
-- exactly, so the app's own code runs on them unchanged with search_path =
-- labs — the race lab's trick (race_lab, 00052). Scratch rows carry the run
-- that wrote them and are deleted when it ends.
CREATE SCHEMA labs;

-- A run's id is taken when it starts (nextval is not transactional), so its
-- scratch rows, Redis keys and fake subjects can carry it before the run's
-- one commit.
CREATE SEQUENCE labs.run_ids;

-- Every finished run: who ran which lab, and its result (the variants' counts
-- and timelines) as the API answers it.
CREATE TABLE labs.runs (
    id          bigint      NOT NULL,
    lab         text        NOT NULL,
    user_id     bigint      NOT NULL REFERENCES public.users (id),
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    result      jsonb       NOT NULL,
    CONSTRAINT runs_pkey PRIMARY KEY (id),
    CONSTRAINT runs_lab_check CHECK (lab ~ '^[a-z][a-z-]{1,31}$')
);
-- "my latest runs of this lab", and the bound each run keeps (the newest few)
CREATE INDEX runs_user_lab_idx ON labs.runs (user_id, lab, id DESC);

-- Subjects of the lab's fake systems (policy:N, booking:N in the fault
-- machinery): never a real policy's id, and never one another run uses, so
-- faults scoped to them touch this run only.
CREATE SEQUENCE labs.subject_ids;

-- As public.idempotency_keys, without the users foreign key (the lab's
-- callers are the run's actors): internal/idempotency's Store runs on it.
CREATE TABLE labs.idempotency_keys (
    user_id             bigint      NOT NULL,
    idempotency_key     text        NOT NULL,
    request_fingerprint bytea       NOT NULL,
    status              text        NOT NULL,
    owner_token         uuid        NOT NULL,
    lease_expires_at    timestamptz NOT NULL,
    response_status     integer,
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL,
    completed_at        timestamptz,
    expires_at          timestamptz NOT NULL,
    -- who executes is decided here, as in the app
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (user_id, idempotency_key),
    CONSTRAINT idempotency_keys_status_check CHECK (status IN ('IN_PROGRESS', 'COMPLETED')),
    CONSTRAINT idempotency_keys_completed_has_response_check CHECK (
        (status = 'COMPLETED') = (response_status IS NOT NULL AND response_headers IS NOT NULL
                                  AND response_body IS NOT NULL AND completed_at IS NOT NULL)),
    CONSTRAINT idempotency_keys_key_check CHECK (idempotency_key ~ '^[!-~]{1,255}$'),
    CONSTRAINT idempotency_keys_fingerprint_check CHECK (octet_length(request_fingerprint) = 32)
);

-- What a lab's work did, one row per effect that committed (the fencing,
-- claim and Redis labs count them). Deliberately no unique constraint: a
-- double effect must be able to show.
CREATE TABLE labs.effects (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  bigint      NOT NULL,
    variant text        NOT NULL,
    actor   text        NOT NULL,
    what    text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX effects_run_idx ON labs.effects (run_id, variant);

-- The Redis lab's operations, twice: without the business constraint
-- (brokenRedisStore's retry inserts a second operation unopposed) …
CREATE TABLE labs.operations_without_unique (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         bigint NOT NULL,
    variant        text   NOT NULL,
    policy_id      bigint NOT NULL,
    operation_type text   NOT NULL,
    status         text   NOT NULL DEFAULT 'IN_PROGRESS'
);
-- … and with it, as public.operations has it.
CREATE TABLE labs.operations (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         bigint NOT NULL,
    variant        text   NOT NULL,
    policy_id      bigint NOT NULL,
    operation_type text   NOT NULL,
    status         text   NOT NULL DEFAULT 'IN_PROGRESS',
    -- business identity: one cancellation per policy, whatever the request key
    CONSTRAINT operations_policy_type_key UNIQUE (run_id, variant, policy_id, operation_type)
);

-- The claim lab's naive claims: check with a SELECT, then INSERT, and no
-- constraint to stop the second insert (brokenCheckThenInsertClaim).
CREATE TABLE labs.claims_without_unique (
    run_id  bigint      NOT NULL,
    key     text        NOT NULL,
    claimer text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- As public.inbox and public.event_deliveries: internal/events' consumer
-- rule (Handler) runs on them; the broken consumer marks messages seen here
-- too, in a transaction of its own.
CREATE TABLE labs.inbox (
    consumer   text        NOT NULL,
    event_id   uuid        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    event_type text        NOT NULL DEFAULT '',
    CONSTRAINT inbox_pkey PRIMARY KEY (consumer, event_id)
);
CREATE TABLE labs.event_deliveries (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id  uuid        NOT NULL,
    consumer  text        NOT NULL,
    transport text        NOT NULL,
    instance  text        NOT NULL,
    attempt   integer     NOT NULL,
    outcome   text        NOT NULL,
    caught_by text,
    injected  text,
    detail    text        NOT NULL DEFAULT '',
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT event_deliveries_outcome_check CHECK (outcome IN ('applied', 'duplicate', 'deferred', 'failed'))
);
-- The consumers' effect: one line per message applied. No unique: the inbox
-- is what keeps it to one, or fails to.
CREATE TABLE labs.consumer_effects (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer text        NOT NULL,
    event_id uuid        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX consumer_effects_consumer_idx ON labs.consumer_effects (consumer);

-- The relay lab's outbox: a sequence number, as a relay that keeps an
-- offset needs, and a status, as a relay that claims rows needs. A number
-- is taken when the row is inserted, not when it commits: that is the lab.
CREATE TABLE labs.outbox (
    seq     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  bigint NOT NULL,
    variant text   NOT NULL,
    name    text   NOT NULL,
    status  text   NOT NULL DEFAULT 'PENDING',
    CONSTRAINT outbox_status_check CHECK (status IN ('PENDING', 'SENT'))
);
-- the claiming relay's scan: PENDING rows of one run and variant
CREATE INDEX outbox_pending_idx ON labs.outbox (run_id, variant, seq) WHERE status = 'PENDING';
-- what reached the broker, one row per publish
CREATE TABLE labs.published (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  bigint NOT NULL,
    variant text   NOT NULL,
    seq     bigint NOT NULL,
    name    text   NOT NULL
);

-- The NULL lab's bookings, twice. `live` is TRUE for a confirmed booking and
-- NULL otherwise, so that cancelled bookings do not collide in a plain
-- unique index — and a confirmed booking whose writer forgot `live` does not
-- collide either: NULLs are distinct.
CREATE TABLE labs.bookings_plain_unique (
    id      bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  bigint  NOT NULL,
    slot_id bigint  NOT NULL,
    status  text    NOT NULL,
    live    boolean,
    writer  text    NOT NULL,
    CONSTRAINT bookings_plain_unique_status_check CHECK (status IN ('CONFIRMED', 'CANCELLED')),
    -- meant as "one confirmed booking per slot"; holds only while live is set
    CONSTRAINT bookings_plain_unique_slot_live_key UNIQUE (run_id, slot_id, live)
);
CREATE TABLE labs.bookings_partial_unique (
    id      bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  bigint  NOT NULL,
    slot_id bigint  NOT NULL,
    status  text    NOT NULL,
    live    boolean,
    writer  text    NOT NULL,
    CONSTRAINT bookings_partial_unique_status_check CHECK (status IN ('CONFIRMED', 'CANCELLED'))
);
-- as public.bookings_one_confirmed_per_slot: keyed on the status itself, so
-- no column a writer forgets can open a hole
CREATE UNIQUE INDEX bookings_partial_unique_one_confirmed ON labs.bookings_partial_unique (run_id, slot_id)
    WHERE status = 'CONFIRMED';

-- As public.external_systems: what the wrong-belief lab's app believes about
-- its system, one row per run and variant (workflow.SetBelief runs on it).
CREATE TABLE labs.external_systems (
    name                text        PRIMARY KEY,
    believed_idempotent boolean     NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    updated_by          text        NOT NULL
);

-- The compensation lab's deposit bookings: HELD while the deposit is
-- charged, then CONFIRMED, or RELEASED by compensation.
CREATE TABLE labs.deposit_bookings (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     bigint NOT NULL,
    variant    text   NOT NULL,
    subject_id bigint NOT NULL,
    status     text   NOT NULL DEFAULT 'HELD',
    CONSTRAINT deposit_bookings_status_check CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED'))
);

-- The labs' fake external system, built on internal/fault like the provider
-- and payments fakes (system 'labs', and 'labs-belief' for the lab whose
-- status queries fail), keeping its state here so no lab effect ever
-- reaches fake_provider or fake_payments, whose ledgers the invariants read.
-- One row per key: the shape fault.Table expects.
CREATE TABLE labs.fake_requests (
    idempotency_key  text        NOT NULL,
    subject_id       bigint      NOT NULL,
    what             text        NOT NULL,
    outcome          text        NOT NULL,
    reject_reason    text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    completes_at     timestamptz NOT NULL,
    attempts         integer     NOT NULL DEFAULT 1,
    last_received_at timestamptz NOT NULL DEFAULT now(),
    -- the fake's own idempotency: one record per key
    CONSTRAINT fake_requests_pkey PRIMARY KEY (idempotency_key),
    CONSTRAINT fake_requests_outcome_check CHECK (outcome IN ('ACCEPTED', 'REJECTED')),
    CONSTRAINT fake_requests_attempts_check CHECK (attempts >= 1)
);
-- One row per effect the fake carried out; no unique key, on purpose: a
-- fake that is not idempotent shows its double effects here.
CREATE TABLE labs.fake_effects (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text        NOT NULL,
    subject_id      bigint      NOT NULL,
    what            text        NOT NULL,
    applied_at      timestamptz NOT NULL
);
CREATE INDEX fake_effects_subject_idx ON labs.fake_effects (subject_id);

-- +goose Down
DROP SCHEMA labs CASCADE;
