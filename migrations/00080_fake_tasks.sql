-- +goose Up

-- The fake task queue's own durable state (internal/tasks/fake), kept as
-- Cloud Tasks keeps it: in a schema of its own, no foreign keys into
-- idemlab's tables (it knows the app only by the URL it pushes to), so a
-- task outlives a crash of the app and of the queue process, and several
-- queue processes on one database are one queue.
CREATE SCHEMA fake_tasks;

-- One row per task created. A task is PENDING until a push is answered 2xx
-- (SUCCEEDED) or its attempts run out (FAILED); while a queue instance is
-- pushing it, schedule_time is pushed forward by the dispatch deadline (the
-- lease), so another instance takes it only if that push never finishes.
CREATE TABLE fake_tasks.tasks (
    id                uuid        PRIMARY KEY,
    queue             text        NOT NULL,
    -- the name the creator gave (or the queue made up): what creation dedupes on
    name              text        NOT NULL,
    url               text        NOT NULL,
    http_method       text        NOT NULL DEFAULT 'POST',
    headers           jsonb       NOT NULL DEFAULT '{}',
    body              bytea       NOT NULL DEFAULT '',
    -- how long one push may take before it counts as failed (Cloud Tasks' dispatchDeadline)
    -- how long one push may take before it counts as failed (dispatchDeadline)
    dispatch_deadline_ms integer  NOT NULL,
    state             text        NOT NULL DEFAULT 'PENDING',
    -- when the next push is due; while a push is under way, when its lease ends
    schedule_time     timestamptz NOT NULL,
    -- the lease of the push under way: its holder's token, fencing its result
    lease_token       uuid,
    -- pushes begun (X-CloudTasks-TaskRetryCount is this minus one)
    dispatch_count    integer     NOT NULL DEFAULT 0,
    -- pushes that got an HTTP answer (X-CloudTasks-TaskExecutionCount)
    response_count    integer     NOT NULL DEFAULT 0,
    last_status       integer,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    -- Cloud Tasks allows 15 s to 30 min; the fake allows shorter, for tests
    CONSTRAINT tasks_dispatch_deadline_check CHECK (dispatch_deadline_ms BETWEEN 1 AND 1800000),
    CONSTRAINT tasks_state_check CHECK (state IN ('PENDING', 'SUCCEEDED', 'FAILED')),
    -- a finished task has its time; a pending one has none
    CONSTRAINT tasks_finished_check CHECK ((state = 'PENDING') = (finished_at IS NULL)),
    CONSTRAINT tasks_counts_check CHECK (dispatch_count >= 0 AND response_count >= 0 AND response_count <= dispatch_count)
);

-- The dispatchers' claim: due PENDING tasks, oldest due first.
CREATE INDEX tasks_due_idx ON fake_tasks.tasks (schedule_time) WHERE state = 'PENDING';
-- List and get by queue and name.
CREATE INDEX tasks_queue_name_idx ON fake_tasks.tasks (queue, name, created_at);

-- The creation dedupe: which task holds each name. A name is taken while its
-- task is PENDING and for the queue's dedupe window after it finished
-- (Cloud Tasks: about an hour); a create in that time is refused
-- (ALREADY_EXISTS). After it, a create takes the name over for a new task.
-- The primary key makes two concurrent creates of one name wait for each
-- other: exactly one gets it.
CREATE TABLE fake_tasks.names (
    queue       text        NOT NULL,
    name        text        NOT NULL,
    task_id     uuid        NOT NULL REFERENCES fake_tasks.tasks (id) ON DELETE CASCADE,
    -- when the holder finished; NULL while it is PENDING (taken, whatever the window)
    finished_at timestamptz,
    CONSTRAINT names_pkey PRIMARY KEY (queue, name)
);

-- Every push, for the task's history (GET …/tasks/{name} shows them).
CREATE TABLE fake_tasks.attempts (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id       uuid        NOT NULL REFERENCES fake_tasks.tasks (id) ON DELETE CASCADE,
    -- 0 for the first push (X-CloudTasks-TaskRetryCount)
    retry         integer     NOT NULL,
    instance      text        NOT NULL,
    dispatched_at timestamptz NOT NULL,
    answered_at   timestamptz NOT NULL DEFAULT now(),
    -- the HTTP status; NULL when no answer came (timeout, refused connection)
    status        integer,
    error         text
);
CREATE INDEX attempts_task_idx ON fake_tasks.attempts (task_id, id);

-- +goose Down
DROP SCHEMA fake_tasks CASCADE;
