package operations_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/testdb"
)

// The janitor purges operations finished longer ago than the retention,
// with their steps, calls, timeline, decisions and audit lines, in batches
// — and never a live operation, one waiting for a person, or the charge of
// a booking that stands.
func TestJanitorPurgesFinishedOperationsOnly(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	seed(t, db, 25, fiveStatuses) // 10 SUCCEEDED, 5 FAILED, 5 IN_PROGRESS, 5 NEEDS_RECONCILIATION
	if _, err := db.Pool.Exec(ctx, `
		UPDATE operations SET finished_at = timestamptz '2026-01-01' WHERE id <= 20 AND finished_at IS NOT NULL;
		UPDATE operations SET finished_at = timestamptz '2026-01-20' WHERE id > 20 AND finished_at IS NOT NULL;
		INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail, statement, step)
		SELECT id, line, ARRAY[line], '{NULL}', ARRAY[status], '{test}', '{NULL}', '{""}', '{""}', '{NULL}'
		  FROM (SELECT id, status, nextval('operation_timeline_line_seq') AS line FROM operations) o;
		INSERT INTO operation_calls (operation_id, step_key, kind, system, actor, attempt, deadline_at, request)
		SELECT id, id || ':provider_cancel', 'call', 'provider', 'test', 1, now(), '{}' FROM operations;
		INSERT INTO operation_calls (operation_id, step_key, kind, call_id, system, actor, outcome)
		SELECT operation_id, step_key, 'answer', id, 'provider', 'test', 'confirmed' FROM operation_calls;
		INSERT INTO reconciliation_decisions (operation_id, step_key, decided_by, actor, decision, seen_updated_at, truth_seen, truth_call_id)
		SELECT id, id || ':provider_cancel', 'admin', 'test', 'retry', now(), 'UNKNOWN', (SELECT min(c.id) FROM operation_calls c WHERE c.operation_id = o.id)
		  FROM operations o;
		INSERT INTO audit_entries (operation_id, step_key, actor, summary, facts)
		SELECT id, id || ':mark_cancelled', 'test', 'done', '{}' FROM operations WHERE status = 'SUCCEEDED';`); err != nil {
		t.Fatal(err)
	}
	count := func(table string) (n int) {
		t.Helper()
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// 31 days after 2026-01-01, with a 30-day retention: operations 1–20
	// that finished (SUCCEEDED, FAILED) are due; 21–25 finished later.
	j := operations.NewJanitor(db.Pool, operations.JanitorConfig{
		Retention: 30 * 24 * time.Hour, BatchSize: 4,
		Clock: clockAt(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)),
	})
	purged, err := j.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if purged != 12 {
		t.Fatalf("purged %d operations, want the 12 finished ones among 1–20", purged)
	}
	var left []string
	rows, _ := db.Pool.Query(ctx, `SELECT status FROM operations WHERE id <= 20 ORDER BY id`)
	for rows.Next() {
		var s string
		rows.Scan(&s)
		left = append(left, s)
	}
	for _, s := range left {
		if s == "SUCCEEDED" || s == "FAILED" {
			t.Errorf("a finished operation due for purging is left: %v", left)
			break
		}
	}
	if len(left) != 8 || count("operations") != 13 {
		t.Errorf("left %v among 1–20 and %d in all, want the 8 live or waiting ones and 13", left, count("operations"))
	}
	for table, want := range map[string]int{
		"operation_steps": 13 * 3, "operation_events": 13, "operation_calls": 13 * 2,
		"reconciliation_decisions": 13, "audit_entries": 2, // operations 24 and 25, SUCCEEDED within the retention
	} {
		if n := count(table); n != want {
			t.Errorf("%s: %d rows left, want %d (those of the operations kept)", table, n, want)
		}
	}
	if again, _ := j.RunOnce(ctx); again != 0 {
		t.Errorf("a second run purged %d more", again)
	}
}

// A deposit booking's operation holds the charge's key that a cancellation
// of the booking refunds: it is kept while the booking stands, and purged
// with the rest once the booking is cancelled.
func TestJanitorKeepsTheChargeOfABookingThatStands(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO users (name, role, api_token_sha256) VALUES ('alice', 'customer', sha256('a'));
		INSERT INTO slots (resource, starts_at, ends_at, deposit_cents)
		VALUES ('studio', '2030-01-01 09:00Z', '2030-01-01 10:00Z', 2500),
		       ('studio', '2030-01-01 10:00Z', '2030-01-01 11:00Z', 2500);
		INSERT INTO bookings (id, slot_id, user_id, status, deposit_cents, cancelled_at)
		VALUES (1, 1, 1, 'CONFIRMED', 2500, NULL), (2, 2, 1, 'CANCELLED', 2500, now());
		UPDATE slots SET status = 'BOOKED', booking_id = 1 WHERE id = 1;
		INSERT INTO operations (booking_id, operation_type, user_id, idempotency_key, status, finished_at)
		VALUES (1, 'BOOK_DEPOSIT', 1, 'k1', 'SUCCEEDED', '2026-01-01'),
		       (2, 'BOOK_DEPOSIT', 1, 'k2', 'SUCCEEDED', '2026-01-01');`); err != nil {
		t.Fatal(err)
	}
	j := operations.NewJanitor(db.Pool, operations.JanitorConfig{
		Clock: clockAt(time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)),
	})
	if purged, err := j.RunOnce(ctx); err != nil || purged != 1 {
		t.Fatalf("purged %d, %v; want only the cancelled booking's", purged, err)
	}
	var left int64
	if err := db.Pool.QueryRow(ctx, `SELECT booking_id FROM operations`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("left the operation of booking %d (%v), want booking 1's (CONFIRMED)", left, err)
	}
}

// clockAt is a database clock that reads t.
func clockAt(t time.Time) *database.Clock {
	c := &database.Clock{}
	c.Set(t)
	return c
}
