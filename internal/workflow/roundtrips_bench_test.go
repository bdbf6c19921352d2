package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkRoundTripCuts runs each round trip cut from a step's writes
// against what it replaced, alternately in one run on one operation, each
// inside a transaction that rolls back (the statements' cost, not a
// commit's), and reports the median of the pairs' after/before (a spike of
// the shared machine moves one pair, not the median): below 1 is what the
// cut saves. What
// the cancellation as a whole sends is counted in internal/policies
// (TestACancellationsRoundTrips); docs/performance.md has the figures.
//
//	go test -run '^$' -bench RoundTripCuts ./internal/workflow/
func BenchmarkRoundTripCuts(b *testing.B) {
	db := testdb.New(b)
	ctx := context.Background()
	if _, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{Users: 1, PoliciesPerUser: 1, Slots: 1},
		time.Now(), demo.TokenFor([]byte("b"))); err != nil {
		b.Fatal(err)
	}
	var opID int64
	var token string
	if err := db.Pool.QueryRow(ctx, `
		INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status, owner_token, owner_id, lease_expires_at)
		SELECT id, 'CANCEL', user_id, 'bench', 'IN_PROGRESS', gen_random_uuid(), 'bench', now() + interval '1 hour'
		  FROM policies ORDER BY id LIMIT 1
		RETURNING id, owner_token::text`).Scan(&opID, &token); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state)
		VALUES ($1, 1, 1, 'call', $2, 'provider', 'PENDING'),
		       ($1, 1, 2, 'a', $3, NULL, 'PENDING'),
		       ($1, 1, 3, 'b', $4, NULL, 'PENDING')`,
		opID, StepKey(opID, "call", 1), StepKey(opID, "a", 1), StepKey(opID, "b", 1)); err != nil {
		b.Fatal(err)
	}
	deadline, request := time.Now().Add(time.Second), json.RawMessage(`{"policy_id": 1}`)
	step := func(tx pgx.Tx, sql string, extra []any, args ...any) error {
		var s StepRecord
		return tx.QueryRow(ctx, sql, append([]any{opID, token, 1, "call"}, args...)...).Scan(append(stepDest(&s), extra...)...)
	}
	sent := func(tx pgx.Tx) (callID int64, err error) {
		return callID, step(tx, sqlStepSent, []any{&callID}, deadline, request, 30.0, "bench", false, nil)
	}
	answer := json.RawMessage(`{"outcome": "confirmed"}`)

	for _, cut := range []struct {
		name          string
		setup         func(tx pgx.Tx) (int64, error) // untimed, in the transaction
		before, after func(tx pgx.Tx, callID int64) error
	}{
		{name: "SENT and its call",
			setup: func(pgx.Tx) (int64, error) { return 0, nil },
			before: func(tx pgx.Tx, _ int64) error {
				if err := step(tx, beforeStepSent, nil, deadline, request, 30.0); err != nil {
					return err
				}
				return tx.QueryRow(ctx, beforeInsertCall, opID, StepKey(opID, "call", 1), "provider", "bench", token, 1, deadline, request).Scan(new(int64))
			},
			after: func(tx pgx.Tx, _ int64) error { _, err := sent(tx); return err },
		},
		{name: "answered and its answer",
			setup: sent,
			before: func(tx pgx.Tx, callID int64) error {
				if _, err := tx.Exec(ctx, beforeInsertAnswer, opID, StepKey(opID, "call", 1), callID, "provider", "bench", token,
					"confirmed", "COMPLETED", "provider confirmed", 5); err != nil {
					return err
				}
				return step(tx, beforeStepAnswered, nil, StepDone, "COMPLETED", answer)
			},
			after: func(tx pgx.Tx, callID int64) error {
				return step(tx, sqlStepAnswered, nil, StepDone, "COMPLETED", answer,
					callID, "bench", "confirmed", "COMPLETED", "provider confirmed", 5)
			},
		},
		{name: "two local steps DONE",
			setup: func(pgx.Tx) (int64, error) { return 0, nil },
			before: func(tx pgx.Tx, _ int64) error {
				for _, name := range []string{"a", "b"} {
					var s StepRecord
					if err := tx.QueryRow(ctx, beforeStepDone, opID, token, 1, name).Scan(stepDest(&s)...); err != nil {
						return err
					}
				}
				return nil
			},
			after: func(tx pgx.Tx, _ int64) error {
				rows, err := tx.Query(ctx, sqlStepsDone, opID, token, 1, []string{"a", "b"})
				if err != nil {
					return err
				}
				steps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (StepRecord, error) { return scanStep(row) })
				if err == nil && len(steps) != 2 {
					err = fmt.Errorf("%d steps marked, want 2", len(steps))
				}
				return err
			},
		},
	} {
		b.Run(cut.name, func(b *testing.B) {
			var ratios []float64
			for b.Loop() {
				var spent [2]time.Duration
				for i, f := range []func(pgx.Tx, int64) error{cut.before, cut.after} {
					tx, err := db.Pool.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					callID, err := cut.setup(tx)
					if err != nil {
						b.Fatal(err)
					}
					start := time.Now()
					if err := f(tx, callID); err != nil {
						b.Fatal(err)
					}
					spent[i] = time.Since(start)
					tx.Rollback(ctx)
				}
				ratios = append(ratios, float64(spent[1])/float64(spent[0]))
			}
			b.ReportMetric(median(ratios), "after/before")
		})
	}
}

// What the cuts replaced, as it was: two statements, two round trips each.
const (
	beforeStepSent = `
WITH owner AS (
    UPDATE operations
       SET lease_expires_at = greatest(lease_expires_at, now() + make_interval(secs => $7)),
           updated_at = now()
     WHERE id = $1 AND owner_token = $2 AND status IN ('IN_PROGRESS', 'RECOVERING')
    RETURNING id
)
UPDATE operation_steps s
   SET state = 'SENT', attempts = s.attempts + 1, deadline_at = greatest(s.deadline_at, $5), sent_at = now(),
       request = coalesce(s.request, $6), updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id AND s.run = $3 AND s.name = $4 AND s.state IN ('PENDING', 'SENT', 'UNKNOWN')
RETURNING ` + stepColumns

	beforeInsertCall = `
INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, owner_token, attempt, deadline_at, request)
VALUES ($1, $2, 'call', $3, $4, $5::uuid, $6, $7, $8)
RETURNING id`

	beforeInsertAnswer = `
INSERT INTO operation_calls (operation_id, step_key, kind, call_id, system, actor, owner_token, outcome, truth, detail, took_ms)
VALUES ($1, $2, 'answer', $3, $4, $5, $6::uuid, $7, $8, $9, $10)`

	beforeStepDone = ownerCTE + `
UPDATE operation_steps s
   SET state = 'DONE', finished_at = now(), updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id AND s.run = $3 AND s.name = $4 AND s.state = 'PENDING'
RETURNING ` + stepColumns

	beforeStepAnswered = ownerCTE + `
UPDATE operation_steps s
   SET state = $5, truth = coalesce($6, s.truth), answer = $7,
       finished_at = CASE WHEN $5 IN ('DONE', 'FAILED') THEN now() END, updated_at = now()
  FROM owner
 WHERE s.operation_id = owner.id AND s.run = $3 AND s.name = $4 AND s.state IN ('SENT', 'UNKNOWN')
RETURNING ` + stepColumns
)

// median is the middle of xs (sorted in place), for ratios of pairs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}
