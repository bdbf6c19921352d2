-- +goose Up

-- A request may wait for an operation's outcome (Prefer: wait=N,
-- internal/operations/wait.go). Each process holds one LISTEN connection;
-- this trigger sends the operation's id on operation_final in the
-- transaction that makes it final, so the notification is delivered exactly
-- when that transaction commits, whichever code made the transition (a
-- request, recovery, a person's decision). It fires only on the transition
-- into a final status, once per operation and run — never on a step write,
-- whose UPDATE does not change the status (the WHEN clause is evaluated
-- without calling the function).
-- +goose StatementBegin
CREATE FUNCTION operations_notify_final() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('operation_final', NEW.id::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER operations_notify_final
    AFTER UPDATE OF status ON operations
    FOR EACH ROW
    WHEN (NEW.status IN ('SUCCEEDED', 'FAILED', 'NEEDS_RECONCILIATION') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION operations_notify_final();

-- +goose Down
DROP TRIGGER operations_notify_final ON operations;
DROP FUNCTION operations_notify_final();
