-- Traces across processes (internal/tracing): where work waits in a table
-- for another process, its W3C trace context waits beside it, so whoever
-- picks the row up continues the same trace.
--
-- operation_steps.traceparent: the span that last sent the step (the
-- request's, or recovery's); recovery resumes an operation in that trace,
-- and the operation page shows each step's trace id.
-- outbox.traceparent: the transaction that wrote the event; the relay
-- carries it in the message (and its headers) to every consumer.
--
-- Both nullable: rows written before tracing, or outside any trace.

-- +goose Up
ALTER TABLE operation_steps ADD COLUMN traceparent text;
ALTER TABLE outbox ADD COLUMN traceparent text;

-- +goose Down
ALTER TABLE outbox DROP COLUMN traceparent;
ALTER TABLE operation_steps DROP COLUMN traceparent;
