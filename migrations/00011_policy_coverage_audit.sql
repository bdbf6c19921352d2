-- +goose Up

-- The period a policy covers. A cancellation refunds the premium of the days
-- not used: premium × (coverage_end − cancellation day) / (coverage_end −
-- coverage_start), to the cent (internal/policies/refund.go).
ALTER TABLE policies ADD COLUMN coverage_start date;
ALTER TABLE policies ADD COLUMN coverage_end date;
UPDATE policies
   SET coverage_start = created_at::date,
       coverage_end = (created_at + interval '1 year')::date;
ALTER TABLE policies ALTER COLUMN coverage_start SET NOT NULL;
ALTER TABLE policies ALTER COLUMN coverage_end SET NOT NULL;
-- a period of at least one day: the refund divides by its length
ALTER TABLE policies ADD CONSTRAINT policies_coverage_check CHECK (coverage_end > coverage_start);

-- The audit trail a finished workflow leaves (the cancellation's last step):
-- one line per run of an operation, written in the transaction that records
-- the step, so it exists exactly when the step is DONE.
CREATE TABLE audit_entries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id bigint      NOT NULL REFERENCES operations (id),
    -- the audit step's key: a step is done once, so it is written once
    step_key     text        NOT NULL REFERENCES operation_steps (step_key),
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text        NOT NULL,
    summary      text        NOT NULL,
    facts        jsonb       NOT NULL,
    CONSTRAINT audit_entries_step_key_key UNIQUE (step_key)
);
CREATE INDEX audit_entries_operation_idx ON audit_entries (operation_id);

-- +goose Down
DROP TABLE audit_entries;
ALTER TABLE policies DROP CONSTRAINT policies_coverage_check;
ALTER TABLE policies DROP COLUMN coverage_end;
ALTER TABLE policies DROP COLUMN coverage_start;
