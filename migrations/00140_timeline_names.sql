-- +goose Up

-- A timeline line names the statement that made its transition
-- ("workflow.sqlStepSent", the constant that holds it): statement keeps the
-- name, not a copy of the text, and the page finds the text and its line in
-- the code (internal/workflow/statements.go). The writer (found by walking
-- the call stack on every line) and the statement's bound values go: the
-- detail says what a person needs to decide. Each line was ~1.4 kB, most of
-- it SQL text, in the heap and in the WAL. Older lines lose their copy.
ALTER TABLE operation_events
    DROP COLUMN writer,
    DROP COLUMN bound;
UPDATE operation_events SET statement = '' WHERE statement <> '';

-- +goose Down
ALTER TABLE operation_events
    ADD COLUMN writer text,
    ADD COLUMN bound  jsonb;
