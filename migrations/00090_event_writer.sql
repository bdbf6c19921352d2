-- +goose Up

-- Which function wrote each timeline line, and the values its statement was
-- run with, so the operation page can link a transition to its code (the
-- viewer at /code/) and show the SQL as it ran, not only its placeholders.
-- writer is "path/file.go:Func" (internal/workflow names it at the time of
-- the write, from the call stack); bound is a JSON array, $1 first. Both
-- are NULL on lines written before this migration and on lines without a
-- statement: the page then shows no link, never a wrong one.
ALTER TABLE operation_events
    ADD COLUMN writer text,
    ADD COLUMN bound  jsonb;

-- +goose Down
ALTER TABLE operation_events
    DROP COLUMN writer,
    DROP COLUMN bound;
