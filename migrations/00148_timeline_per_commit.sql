-- The timeline, one row per commit (issue 24, item 9). The engine writes an
-- operation's timeline lines at the end of the transaction that made them,
-- all at once (workflow's flush): nine lines in three commits for a
-- cancellation. As a row each they were nine heap records and nine index
-- entries in the WAL; as a row per commit, three and three. A row holds its
-- lines in order, one array per column, each line's values at the same
-- index. The view operation_events reads it back a line a row, with the
-- columns the timeline always had: readers did not change.

-- +goose Up
CREATE TABLE operation_timeline (
    operation_id bigint NOT NULL,
    id bigint NOT NULL, -- its first line's id: rows in id order are lines in the order they committed
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    line_ids bigint[] NOT NULL, -- each line's own id (operation_timeline_line_seq), the page's and the API's
    from_status text[] NOT NULL,
    to_status text[] NOT NULL,
    actor text[] NOT NULL,
    owner_token uuid[] NOT NULL,
    detail text[] NOT NULL,
    statement text[] NOT NULL, -- the name of the statement that made each line ('' for none)
    branch text[], -- the recovery branch of each line; NULL when no line has one (operation_timeline_branch_idx)
    step text[] NOT NULL,
    PRIMARY KEY (operation_id, id), -- a timeline is read by operation, in order
    -- one value per line in every column
    CONSTRAINT operation_timeline_lines_check CHECK (
        cardinality(line_ids) > 0 AND id = line_ids[1]
        AND cardinality(line_ids) = ALL (ARRAY[cardinality(from_status), cardinality(to_status), cardinality(actor),
                                               cardinality(owner_token), cardinality(detail), cardinality(statement),
                                               cardinality(step), coalesce(cardinality(branch), cardinality(line_ids))]))
);
CREATE SEQUENCE operation_timeline_line_seq OWNED BY operation_timeline.id;
-- the recovery page's latest decisions, newest first
CREATE INDEX operation_timeline_branch_idx ON operation_timeline (id DESC) WHERE branch IS NOT NULL;

INSERT INTO operation_timeline (operation_id, id, at, line_ids, from_status, to_status, actor, owner_token, detail,
                                statement, branch, step)
SELECT operation_id, id, at, ARRAY[id], ARRAY[from_status], ARRAY[to_status], ARRAY[actor], ARRAY[owner_token],
       ARRAY[detail], ARRAY[statement], CASE WHEN branch IS NOT NULL THEN ARRAY[branch] END, ARRAY[step]
  FROM operation_events;
SELECT setval('operation_timeline_line_seq', coalesce((SELECT max(id) FROM operation_events), 0) + 1, false);
DROP TABLE operation_events;

-- The timeline a line a row. (Multi-argument unnest reads the arrays side by
-- side; a NULL branch array reads as a NULL branch on every line.)
CREATE VIEW operation_events AS
SELECT l.id, t.operation_id, t.at, l.from_status, l.to_status, l.actor, l.owner_token, l.detail, l.statement,
       l.branch, l.step
  FROM operation_timeline t,
       unnest(t.line_ids, t.from_status, t.to_status, t.actor, t.owner_token, t.detail, t.statement, t.branch, t.step)
           AS l(id, from_status, to_status, actor, owner_token, detail, statement, branch, step);

-- +goose Down
CREATE TABLE operation_events_down AS SELECT * FROM operation_events;
DROP VIEW operation_events;
CREATE TABLE operation_events (
    id bigint GENERATED ALWAYS AS IDENTITY,
    operation_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_status text,
    to_status text NOT NULL,
    actor text NOT NULL,
    owner_token uuid,
    detail text NOT NULL DEFAULT '',
    statement text NOT NULL DEFAULT '',
    branch text,
    step text,
    PRIMARY KEY (operation_id, id)
);
CREATE INDEX operation_events_branch_idx ON operation_events (id DESC) WHERE branch IS NOT NULL;
INSERT INTO operation_events OVERRIDING SYSTEM VALUE SELECT * FROM operation_events_down;
SELECT setval('operation_events_id_seq', coalesce((SELECT max(id) FROM operation_events), 0) + 1, false);
DROP TABLE operation_events_down;
DROP TABLE operation_timeline;
