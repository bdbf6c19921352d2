-- +goose Up

-- The inbox records the type of each event it took, so "no inbox row
-- without its effect" can be checked for the types a consumer acts on
-- (a consumer records every event it is given, and ignores types it does
-- not know) even after the outbox row is gone (internal/invariants).
ALTER TABLE inbox ADD COLUMN event_type text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE inbox DROP COLUMN event_type;
