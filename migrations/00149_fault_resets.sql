-- When each fake was last reset. A reset forgets the fake's records — its
-- requests, effects, charges and refunds — and with them the other side of
-- every step the app sent it before: the invariants that compare a DONE
-- step with the system's record (4, 7, 8) cannot check those steps any
-- more, and must not call them broken. They check every step sent after
-- the reset as before (internal/invariants).

-- +goose Up
CREATE TABLE fault.resets (
    system   text        PRIMARY KEY, -- one row a fake: its last reset
    reset_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE fault.resets;
