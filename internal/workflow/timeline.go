package workflow

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// This file is what the engine writes for people to read, beside the
// steps themselves: the operation's timeline (operation_timeline, a row
// per commit, its lines in order) and the status queries it asked
// (operation_calls). Both are written in the transaction whose work they
// describe, at its end, so neither ever shows what rolled back. A line
// names the statement behind its transition (statements.go) and never
// copies its text. The pages read them back (internal/readmodel).

// event notes a line for the timeline: the transition from from (equal to
// the status now for a step's progress), about step ("" for the operation
// as a whole), made by the statement called statement — the Go constant
// that holds it, "workflow.sqlStepSent" ("" for none; statements.go
// resolves a name to its text for the pages). The lines are written
// together, by flush, at the end of the transaction that made them — so
// the timeline never shows what rolled back, and a transaction of six steps
// costs one insert, not six.
func (r *runner) event(_ context.Context, _ pgx.Tx, from, step, detail, statement string) error {
	r.events = append(r.events, event{op: r.op, from: from, actor: r.actor, branch: r.branch, step: step,
		detail: detail, statement: statement})
	return nil
}

// sqlInsertEvents writes the lines noted in one transaction: a row per
// operation (operation_timeline), its lines in the order they happened,
// each with an id of its own — one row, not one per line, so one heap
// record and one index entry per commit in the WAL. The view
// operation_events reads them back a line a row.
const sqlInsertEvents = `
WITH line AS (
    SELECT e.*, nextval('operation_timeline_line_seq') AS line_id -- in the order noted
      FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
           WITH ORDINALITY AS e(operation_id, from_status, to_status, actor, owner_token, detail, statement, branch, step, n)
)
INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail,
                                statement, branch, step)
SELECT operation_id,
       (array_agg(line_id ORDER BY n))[1],
       array_agg(line_id ORDER BY n),
       array_agg(nullif(from_status, '') ORDER BY n),
       array_agg(to_status ORDER BY n),
       array_agg(actor ORDER BY n),
       array_agg(owner_token::uuid ORDER BY n),
       array_agg(detail ORDER BY n),
       array_agg(statement ORDER BY n),
       CASE WHEN bool_or(branch <> '') THEN array_agg(nullif(branch, '') ORDER BY n) END, -- NULL: no recovery line
       array_agg(nullif(step, '') ORDER BY n)
  FROM line
 GROUP BY operation_id`

// flush writes, in tx, the timeline lines and status queries noted since
// the transaction began. Every transaction a runner opens ends with it.
func (r *runner) flush(ctx context.Context, tx pgx.Tx) error {
	if err := r.flushAsked(ctx, tx); err != nil {
		return err
	}
	if err := insertEvents(ctx, tx, r.events); err != nil {
		return err
	}
	r.events = r.events[:0]
	return nil
}

// insertEvents writes timeline lines in one statement, in their order, in
// db's transaction — so the timeline never shows what rolled back.
func insertEvents(ctx context.Context, db database.DBTX, evs []event) error {
	n := len(evs)
	if n == 0 {
		return nil
	}
	ids, from, to, actors, tokens := make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
	details, names, branches, steps := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, ev := range evs {
		ids[i], from[i], to[i], actors[i], tokens[i] = ev.op.ID, ev.from, ev.op.Status, ev.actor, ev.op.OwnerToken
		details[i], names[i], branches[i], steps[i] = ev.detail, ev.statement, ev.branch, ev.step
	}
	if _, err := db.Exec(ctx, sqlInsertEvents, ids, from, to, actors, tokens, details, names, branches, steps); err != nil {
		return fmt.Errorf("workflow: record events: %w", err)
	}
	return nil
}

// recordEvent appends ev alone in db's transaction.
func recordEvent(ctx context.Context, db database.DBTX, ev event) error {
	return insertEvents(ctx, db, []event{ev})
}

// flushAsked appends the status queries made since the last write to
// operation_calls, in tx.
func (r *runner) flushAsked(ctx context.Context, tx pgx.Tx) error {
	for _, q := range r.asked {
		detail := ""
		if q.err != nil {
			detail = q.err.Error()
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, owner_token, truth, detail, took_ms)
			VALUES ($1, $2, 'status', $3, $4, nullif($5, '')::uuid, $6, $7, $8)`,
			r.op.ID, q.key, q.system, r.actor, r.token, nullTruth(q.truth), detail, q.took.Milliseconds())
		if err != nil {
			return fmt.Errorf("workflow: record status query: %w", err)
		}
	}
	r.asked = r.asked[:0]
	return nil
}
