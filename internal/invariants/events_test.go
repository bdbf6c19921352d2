package invariants_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/testdb"
)

// Invariant 9, broken on purpose each way it can be: Check must name it
// and the offending event. A check that cannot fail proves nothing.
func TestEveryBrokenEventInvariantIsReported(t *testing.T) {
	t.Parallel()
	const ev = "01a2381f-0267-70c7-8d90-7303ae0ed5f0"
	mail := `INSERT INTO mailbox (user_id, event_id, subject, body) SELECT id, '` + ev + `', 's', 'b' FROM users WHERE name = 'alice';`
	line := `INSERT INTO ledger_entries (event_id, day, kind, amount) VALUES ('` + ev + `', '2026-01-01', 'cancellation', 10);
	         INSERT INTO ledger_days (day, cancellations, refunds) VALUES ('2026-01-01', 1, 10)
	             ON CONFLICT (day) DO UPDATE SET cancellations = ledger_days.cancellations + 1, refunds = ledger_days.refunds + 10;`
	inbox := func(consumer string) string {
		return `INSERT INTO inbox (consumer, event_id, event_type) VALUES ('` + consumer + `', '` + ev + `', 'policy.cancelled');`
	}
	// the history applied it (so only invariant 9's check fires)
	history := `INSERT INTO histories (key, version, state) VALUES ('policy:1', 1, 'cancelled');
	            INSERT INTO history_events (key, seq, event_id, type) VALUES ('policy:1', 1, '` + ev + `', 'policy.cancelled');`
	outbox := func(seq int) string {
		return fmt.Sprintf(`INSERT INTO outbox (id, type, key, payload, transport, created_at, seq)
			VALUES ('%s', 'policy.cancelled', 'policy:1', '{}', 'nats', now() - interval '2 minutes', %d);`, ev, seq)
	}
	for _, tc := range []struct {
		name, sql string
		invariant int    // 0: 9
		key       string // "": ev
	}{
		{name: "a message applied twice", sql: inbox("notifications") + mail + mail},
		{name: "a ledger line applied twice", sql: inbox("ledger") + line + line},
		{name: "notifications' inbox row without its message", sql: inbox("notifications")},
		{name: "the ledger's inbox row without its line", sql: inbox("ledger")},
		{name: "a message without its inbox row", sql: mail},
		{name: "a ledger day that is not the sum of its lines", sql: inbox("ledger") + line +
			`UPDATE ledger_days SET refunds = refunds + 1;`},
		{name: "an event nobody but the history applied, long after it was written", sql: outbox(1) + history + inbox("history")},
		// Invariant 10: a consumer that needs order.
		{name: "a history that is not the fold of its events", sql: history + `UPDATE histories SET state = 'held';`,
			invariant: 10, key: "policy:1"},
		{name: "a history with a gap", sql: history + `UPDATE histories SET version = 2;`, invariant: 10, key: "policy:1"},
		{name: "an event applied at another place than its own",
			sql:       outbox(2) + history + `UPDATE outbox SET created_at = now(); INSERT INTO outbox_sequences VALUES ('policy:1', 2);`,
			invariant: 10},
		{name: "an event parked long ago", invariant: 10, sql: `
			INSERT INTO history_parked (key, seq, event_id, type, payload, created_at)
			VALUES ('policy:1', 2, '` + ev + `', 'policy.cancelled', '{}', now() - interval '2 minutes');`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, tc.sql); err != nil {
				t.Fatal(err)
			}
			r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if r.OK || len(r.Violations) != 1 {
				t.Fatalf("want exactly one violation, got %+v", r.Violations)
			}
			v := r.Violations[0]
			want, key := cmp.Or(tc.invariant, 9), cmp.Or(tc.key, ev)
			if v.Invariant != want || len(v.Keys) != 1 || (v.Keys[0] != key && v.Keys[0] != "2026-01-01") {
				t.Errorf("violation %+v, want invariant %d naming %s", v, want, key)
			}
		})
	}
}
