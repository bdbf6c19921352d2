-- +goose Up

-- One table for the operations of every workflow (internal/workflow,
-- docs/workflows.md). It was policy_operations; a workflow now spans several
-- systems, so what it has done lives per step (operation_steps) and what it
-- asked of other systems in an append-only log (operation_calls).
ALTER TABLE policy_operations RENAME TO operations;
ALTER SEQUENCE policy_operations_id_seq RENAME TO operations_id_seq;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_pkey TO operations_pkey;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_policy_type_key TO operations_policy_type_key;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_policy_id_fkey TO operations_policy_id_fkey;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_user_id_fkey TO operations_user_id_fkey;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_status_check TO operations_status_check;
ALTER TABLE operations RENAME CONSTRAINT policy_operations_owned_check TO operations_owned_check;
ALTER INDEX policy_operations_stale_idx RENAME TO operations_stale_idx;
ALTER INDEX policy_operations_user_idx RENAME TO operations_user_idx;
ALTER INDEX policy_operations_reconcile_idx RENAME TO operations_reconcile_idx;

-- The subject: a policy today, a booking for the deposit saga. Exactly one.
ALTER TABLE operations ALTER COLUMN policy_id DROP NOT NULL;
ALTER TABLE operations ADD COLUMN booking_id bigint REFERENCES bookings (id);
ALTER TABLE operations ADD CONSTRAINT operations_one_subject_check CHECK (num_nonnulls(policy_id, booking_id) = 1);
-- business identity for bookings, as operations_policy_type_key is for policies
ALTER TABLE operations ADD CONSTRAINT operations_booking_type_key UNIQUE (booking_id, operation_type);
-- the workflows that exist; each later workflow widens this list in its migration
ALTER TABLE operations DROP CONSTRAINT policy_operations_type_check;
ALTER TABLE operations ADD CONSTRAINT operations_type_check CHECK (operation_type IN ('CANCEL'));

-- Why the lease ended early, so a claim can say why it was claimable:
-- handed_over (the owner met an unknown outcome and gave the work to
-- recovery on purpose), backed_off (an attempt learned nothing; claimable
-- again at next_attempt_at), retry_requested (a person asked for another
-- try). NULL while an owner holds its lease: claimable only once it runs out.
ALTER TABLE operations ADD COLUMN released text;
ALTER TABLE operations ADD CONSTRAINT operations_released_check
    CHECK (released IN ('handed_over', 'backed_off', 'retry_requested'));
-- NEEDS_RECONCILIATION operations are asked again when next_attempt_at comes
CREATE INDEX operations_reask_idx ON operations (next_attempt_at) WHERE status = 'NEEDS_RECONCILIATION';

-- What the app believes about each external system. Whether a repeated call
-- with the same key applies nothing new cannot be learned by experiment —
-- trying is exactly the double effect — so it is a setting, one per system,
-- read by the recovery decision at the moment it decides.
CREATE TABLE external_systems (
    name                text        PRIMARY KEY,
    believed_idempotent boolean     NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- who set it: "default", "PROVIDER_IDEMPOTENT_CALLS at the start of app-1", "admin (…)"
    updated_by          text        NOT NULL
);
INSERT INTO external_systems (name, believed_idempotent, updated_by)
VALUES ('provider', true, 'default'),
       ('payments', true, 'default');

-- One row per step of each run of an operation. A local step goes PENDING →
-- DONE in the transaction of its neighbours; an external step is recorded
-- SENT (with its deadline) before its call and DONE or FAILED only once the
-- outcome is known, UNKNOWN while it is not.
CREATE TABLE operation_steps (
    operation_id bigint      NOT NULL REFERENCES operations (id),
    -- a FAILED operation started again runs its steps again under new keys
    run          integer     NOT NULL,
    position     integer     NOT NULL,
    name         text        NOT NULL,
    -- the idempotency key of the step's call: {operation}:{step}, plus :{run}
    -- after a restart. Derived, never random, never a list position.
    step_key     text        NOT NULL,
    -- the system an external step calls; NULL for a local step
    system       text        REFERENCES external_systems (name),
    state        text        NOT NULL DEFAULT 'PENDING',
    -- calls made for this step (every retry, by whoever owned it)
    attempts     integer     NOT NULL DEFAULT 0,
    -- the latest Request-Deadline any attempt carried: until it (plus the
    -- clock-skew margin) has passed, NOT_STARTED is not conclusive
    deadline_at  timestamptz,
    sent_at      timestamptz,
    finished_at  timestamptz,
    -- the request, computed once and resent verbatim by every retry
    request      jsonb,
    -- the last answer got, or why none came
    answer       jsonb,
    -- the system's truth for step_key as last known
    truth        text,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT operation_steps_pkey PRIMARY KEY (operation_id, run, position),
    CONSTRAINT operation_steps_name_key UNIQUE (operation_id, run, name),
    -- one call identity per step and run: two steps can never share a key
    CONSTRAINT operation_steps_step_key_key UNIQUE (step_key),
    CONSTRAINT operation_steps_state_check CHECK (state IN ('PENDING', 'SENT', 'DONE', 'FAILED', 'UNKNOWN')),
    CONSTRAINT operation_steps_truth_check CHECK (truth IN ('NOT_STARTED', 'RUNNING', 'COMPLETED', 'REJECTED')),
    -- only a step that calls out can be in flight or unknown
    CONSTRAINT operation_steps_local_check CHECK (system IS NOT NULL OR state IN ('PENDING', 'DONE', 'FAILED')),
    -- a call is recorded, with its deadline, before it is made
    CONSTRAINT operation_steps_sent_check CHECK (
        state NOT IN ('SENT', 'UNKNOWN') OR (deadline_at IS NOT NULL AND sent_at IS NOT NULL AND request IS NOT NULL)),
    -- finished exactly when DONE or FAILED
    CONSTRAINT operation_steps_finished_check CHECK ((state IN ('DONE', 'FAILED')) = (finished_at IS NOT NULL))
);

-- The append-only log of every exchange with another system: each call
-- (recorded before it is made), each call's answer or that none came, each
-- status query and what it said. Nothing here is ever updated.
CREATE TABLE operation_calls (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id bigint      NOT NULL REFERENCES operations (id),
    step_key     text        NOT NULL REFERENCES operation_steps (step_key),
    -- call: a request about to be sent · answer: what came back for call_id
    -- (or that nothing did) · status: a status query and its answer
    kind         text        NOT NULL,
    call_id      bigint      REFERENCES operation_calls (id),
    system       text        NOT NULL REFERENCES external_systems (name),
    actor        text        NOT NULL,
    owner_token  uuid,
    -- when this row was recorded: for a call, just before it was sent; for an
    -- answer or a status query, just after the answer (or the giving up)
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- call: the attempt number and the Request-Deadline it carried
    attempt      integer,
    deadline_at  timestamptz,
    request      jsonb,
    -- answer: confirmed | rejected | unknown
    outcome      text,
    -- answer, status: the system's truth as it said it (NULL: it said nothing)
    truth        text,
    -- the refusal's reason, or why nothing usable came back
    detail       text        NOT NULL DEFAULT '',
    -- answer, status: how long the exchange took, measured by the caller
    took_ms      integer,
    CONSTRAINT operation_calls_kind_check CHECK (kind IN ('call', 'answer', 'status')),
    CONSTRAINT operation_calls_call_check CHECK (
        kind <> 'call' OR (attempt IS NOT NULL AND deadline_at IS NOT NULL AND request IS NOT NULL)),
    CONSTRAINT operation_calls_answer_check CHECK ((kind = 'answer') = (call_id IS NOT NULL AND outcome IS NOT NULL)),
    CONSTRAINT operation_calls_outcome_check CHECK (outcome IN ('confirmed', 'rejected', 'unknown')),
    CONSTRAINT operation_calls_truth_check CHECK (truth IN ('NOT_STARTED', 'RUNNING', 'COMPLETED', 'REJECTED'))
);
-- an operation's page lists its exchanges in order
CREATE INDEX operation_calls_operation_idx ON operation_calls (operation_id, id);
-- the deadline rule reads every earlier attempt of a step
CREATE INDEX operation_calls_step_key_idx ON operation_calls (step_key, id);

-- The timeline names the step an event is about (NULL: the operation as a whole).
ALTER TABLE operation_events ADD COLUMN step text;

-- Existing operations keep what they did: their three steps, the provider
-- step under the key the provider already knows.
INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, attempts,
                             deadline_at, sent_at, finished_at, request, truth)
SELECT o.id, o.run, s.position, s.name,
       CASE WHEN s.name = 'provider_cancel' THEN o.provider_key ELSE format('%s:%s', o.id, s.name) END,
       CASE WHEN s.name = 'provider_cancel' THEN 'provider' END,
       coalesce(o.steps ->> s.name, 'PENDING'),
       CASE WHEN s.name = 'provider_cancel' THEN greatest(o.attempts, 1) ELSE 0 END,
       CASE WHEN s.name = 'provider_cancel' THEN o.created_at END,
       CASE WHEN s.name = 'provider_cancel' THEN o.created_at END,
       CASE WHEN coalesce(o.steps ->> s.name, 'PENDING') IN ('DONE', 'FAILED') THEN coalesce(o.finished_at, o.updated_at) END,
       CASE WHEN s.name = 'provider_cancel'
            THEN jsonb_build_object('policy_id', o.policy_id, 'reason', o.reason) END,
       CASE WHEN s.name = 'provider_cancel' THEN o.provider_truth END
  FROM operations o,
       (VALUES (1, 'record_intent'), (2, 'provider_cancel'), (3, 'mark_cancelled')) AS s(position, name);

ALTER TABLE operations DROP COLUMN steps;
ALTER TABLE operations DROP COLUMN provider_truth;
ALTER TABLE operations DROP COLUMN provider_key; -- its unique constraint goes with it

-- +goose Down
ALTER TABLE operations ADD COLUMN provider_key text;
ALTER TABLE operations ADD COLUMN provider_truth text;
ALTER TABLE operations ADD COLUMN steps jsonb NOT NULL DEFAULT '{}';
UPDATE operations o
   SET provider_key = s.step_key,
       provider_truth = s.truth
  FROM operation_steps s
 WHERE s.operation_id = o.id
   AND s.run = o.run
   AND s.name = 'provider_cancel';
UPDATE operations o
   SET steps = (SELECT jsonb_object_agg(s.name, s.state)
                  FROM operation_steps s
                 WHERE s.operation_id = o.id
                   AND s.run = o.run
                   AND s.name IN ('record_intent', 'provider_cancel', 'mark_cancelled'));
UPDATE operations SET provider_key = format('policy-%s-cancel-%s', policy_id, run) WHERE provider_key IS NULL;
ALTER TABLE operations ALTER COLUMN provider_key SET NOT NULL;
ALTER TABLE operations ADD CONSTRAINT policy_operations_provider_key_key UNIQUE (provider_key);

ALTER TABLE operation_events DROP COLUMN step;
DROP TABLE operation_calls;
DROP TABLE operation_steps;
DROP TABLE external_systems;
DROP INDEX operations_reask_idx;
ALTER TABLE operations DROP CONSTRAINT operations_released_check;
ALTER TABLE operations DROP COLUMN released;
ALTER TABLE operations DROP CONSTRAINT operations_type_check;
ALTER TABLE operations ADD CONSTRAINT policy_operations_type_check CHECK (operation_type IN ('CANCEL'));
ALTER TABLE operations DROP CONSTRAINT operations_booking_type_key;
ALTER TABLE operations DROP CONSTRAINT operations_one_subject_check;
ALTER TABLE operations DROP COLUMN booking_id;
ALTER TABLE operations ALTER COLUMN policy_id SET NOT NULL;

ALTER INDEX operations_reconcile_idx RENAME TO policy_operations_reconcile_idx;
ALTER INDEX operations_user_idx RENAME TO policy_operations_user_idx;
ALTER INDEX operations_stale_idx RENAME TO policy_operations_stale_idx;
ALTER TABLE operations RENAME CONSTRAINT operations_owned_check TO policy_operations_owned_check;
ALTER TABLE operations RENAME CONSTRAINT operations_status_check TO policy_operations_status_check;
ALTER TABLE operations RENAME CONSTRAINT operations_user_id_fkey TO policy_operations_user_id_fkey;
ALTER TABLE operations RENAME CONSTRAINT operations_policy_id_fkey TO policy_operations_policy_id_fkey;
ALTER TABLE operations RENAME CONSTRAINT operations_policy_type_key TO policy_operations_policy_type_key;
ALTER TABLE operations RENAME CONSTRAINT operations_pkey TO policy_operations_pkey;
ALTER SEQUENCE operations_id_seq RENAME TO policy_operations_id_seq;
ALTER TABLE operations RENAME TO policy_operations;
