package invariants_test

import (
	"context"
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
	for _, tc := range []struct {
		name, sql string
	}{
		{"a message applied twice", inbox("notifications") + mail + mail},
		{"a ledger line applied twice", inbox("ledger") + line + line},
		{"notifications' inbox row without its message", inbox("notifications")},
		{"the ledger's inbox row without its line", inbox("ledger")},
		{"a message without its inbox row", mail},
		{"a ledger day that is not the sum of its lines", inbox("ledger") + line +
			`UPDATE ledger_days SET refunds = refunds + 1;`},
		{"an event nobody applied, long after it was written", `
			INSERT INTO outbox (id, type, key, payload, transport, created_at)
			VALUES ('` + ev + `', 'policy.cancelled', 'policy:1', '{}', 'nats', now() - interval '2 minutes');`},
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
			if v.Invariant != 9 || len(v.Keys) != 1 || (v.Keys[0] != ev && v.Keys[0] != "2026-01-01") {
				t.Errorf("violation %+v, want invariant 9 naming %s", v, ev)
			}
		})
	}
}
