package workflow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// This file is how a stopped operation is started again from one of its
// steps, as its next run: the steps before it carried over, DONE, under the
// keys they were done with; the step and the rest laid out under the new
// run's keys. When that is safe — the rule — is internal/operations'
// (RetryableFrom); the engine writes it, under the operation's lock and
// conditional on the state the person saw.

// RetryFromRequest is a person's retry of one operation from one step.
type RetryFromRequest struct {
	OperationID   int64
	Step          string
	SeenUpdatedAt time.Time // the operation's updated_at as the person saw it
	RequestKey    string    // the request's Idempotency-Key: the new run answers it
	Actor         string    // "admin (request … on app-1)", on the timeline
}

// sqlRetryFrom starts the stopped operation again as its next run, from a
// step: conditional on the state the person saw, like a desk decision, so
// of two people retrying at once one wins, and a retry never runs over a
// decision or a recovery that came first.
const sqlRetryFrom = `
UPDATE operations
   SET status = 'IN_PROGRESS',
       run = run + 1,
       idempotency_key = $2,
       owner_token = gen_random_uuid(),
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       released = NULL,
       attempts = 0,
       next_attempt_at = NULL,
       last_error = NULL,
       finished_at = NULL,
       cancel_requested_at = NULL, -- a new run is not the cancelled one
       cancel_requested_by = NULL,
       updated_at = now()
 WHERE id = $1
   AND status IN ('FAILED', 'NEEDS_RECONCILIATION')
   AND updated_at = $5 -- 0 rows: it changed since it was shown
RETURNING ` + OperationColumns

// sqlCarrySteps lays out the new run ($2): the steps before position $3
// carried from the run before, as they were done (same key, same answer,
// carried_from_run the run that did them); the retried step and the rest
// PENDING under the new run's keys ($4 names, $5 keys, $6 systems, from
// position $3 on), the retried step with its request as first computed
// ($7: the same refund, under a new key).
const sqlCarrySteps = `
INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, attempts, deadline_at,
                             sent_at, finished_at, request, answer, truth, carried_from_run)
SELECT operation_id, $2, position, name, step_key, system, 'DONE', attempts, deadline_at,
       sent_at, finished_at, request, answer, truth, coalesce(carried_from_run, run)
  FROM operation_steps
 WHERE operation_id = $1
   AND run = $2 - 1
   AND position < $3
   AND state = 'DONE' -- the rule checked it under the operation's lock
UNION ALL
SELECT $1, $2, $3 + s.n - 1, s.name, s.step_key, s.system, 'PENDING', 0, NULL,
       NULL, NULL, CASE WHEN s.n = 1 THEN $7::jsonb END, NULL, NULL, NULL
  FROM unnest($4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS s(name, step_key, system, n)
RETURNING ` + stepColumns

// RetryFrom starts the operation again from req.Step in tx, as its next
// run owned by owner, and returns it with the new run's steps laid out —
// a StartFunc's work, for Engine.Start, which runs it from there — and seen,
// the operation as the person acted on it. existing is true when the
// request that made this retry came back (same key): nothing is done again.
// check, the rule, sees the operation as locked and may refuse. Refusals,
// nothing written: ErrNotFound, ErrStateChanged, and check's own.
func (e *Engine) RetryFrom(ctx context.Context, tx pgx.Tx, req RetryFromRequest, owner Owner, check func(seen Operation) error) (seen, op Operation, existing bool, err error) {
	var locked int64
	err = tx.QueryRow(ctx, `SELECT id FROM operations WHERE id = $1 FOR UPDATE`, req.OperationID).Scan(&locked)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, Operation{}, false, ErrNotFound
	}
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: %w", req.OperationID, err)
	}
	if seen, err = e.operation(ctx, tx, req.OperationID); err != nil {
		return Operation{}, Operation{}, false, err
	}
	if seen.IdempotencyKey == req.RequestKey {
		return seen, seen, true, nil // this request's own run, come back after a crash
	}
	if !seen.UpdatedAt.Equal(req.SeenUpdatedAt) {
		return Operation{}, Operation{}, false, ErrStateChanged
	}
	if err := check(seen); err != nil {
		return Operation{}, Operation{}, false, err
	}
	op, err = ScanOperation(tx.QueryRow(ctx, sqlRetryFrom, seen.ID, req.RequestKey, owner.ID, owner.Lease.Seconds(), req.SeenUpdatedAt))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, Operation{}, false, ErrStateChanged
	}
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: %w", seen.ID, err)
	}

	var from StepRecord
	var names, keys []string
	var systems []*string
	var carried []string
	for _, s := range seen.Steps {
		switch {
		case s.Name == req.Step:
			from = s
		case from.Name == "":
			carried = append(carried, s.Name)
			continue
		}
		names, keys, systems = append(names, s.Name), append(keys, StepKey(op.ID, s.Name, op.Run)), append(systems, s.System)
	}
	rows, err := tx.Query(ctx, sqlCarrySteps, op.ID, op.Run, from.Position, names, keys, systems, from.Request)
	if err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: lay out run %d: %w", op.ID, op.Run, err)
	}
	if op.Steps, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) { return scanStep(row) }); err != nil {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: lay out run %d: %w", op.ID, op.Run, err)
	}
	if len(op.Steps) != len(seen.Steps) {
		return Operation{}, Operation{}, false, fmt.Errorf("workflow: retry %d: run %d has %d steps, run %d had %d", op.ID, op.Run, len(op.Steps), seen.Run, len(seen.Steps))
	}
	orderSteps(op.Steps)
	detail := fmt.Sprintf("retried from %s: run %d — %s under a new key %s", req.Step, op.Run, req.Step, StepKey(op.ID, req.Step, op.Run))
	if len(carried) > 0 {
		detail += fmt.Sprintf("; %s carried over from run %d, done and not sent again", strings.Join(carried, ", "), seen.Run)
	}
	if seen.CancelRequestedAt != nil {
		detail += "; the cancel requested by " + database.Deref(seen.CancelRequestedBy) + " is set aside: a new run is not the cancelled one"
	}
	return seen, op, false, recordEvent(ctx, tx, event{op: op, from: seen.Status, actor: req.Actor, step: req.Step,
		detail: detail, statement: "workflow.sqlRetryFrom"})
}

// orderSteps puts a run's steps in their order.
func orderSteps(steps []StepRecord) {
	slices.SortFunc(steps, func(a, b StepRecord) int { return a.Position - b.Position })
}
