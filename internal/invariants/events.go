package invariants

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Invariant 9 (DESIGN.md): every committed event is delivered at least
// once and applied exactly once by each consumer; no inbox row without its
// effect. Its offending rows are events, named by their UUIDs (Keys).
//
// "Exactly once" is checked on the effects themselves (one mailbox message
// and one ledger line per event), not on the inbox, whose primary key makes
// a second row impossible anyway: the effects are what a customer and an
// accountant see. The mailbox and ledger lines have no unique event_id on
// purpose, so a consumer that skipped its inbox would show here.
var eventChecks = []struct {
	detail string
	sql    string
	stale  bool // an "after heal" check: needs Options.StaleAfter: events not delivered yet (Violation.Undelivered)
}{
	{"an event that produced more than one mailbox message (notifications applied it twice)", `
		SELECT event_id::text
		  FROM mailbox
		 GROUP BY event_id
		HAVING count(*) > 1`, false},
	{"an event that produced more than one ledger line (the ledger applied it twice)", `
		SELECT event_id::text
		  FROM ledger_entries
		 GROUP BY event_id
		HAVING count(*) > 1`, false},
	{"an inbox row of notifications without its mailbox message", `
		SELECT i.event_id::text
		  FROM inbox i
		  LEFT JOIN mailbox m ON m.event_id = i.event_id
		 WHERE i.consumer = 'notifications'
		   AND i.event_type IN ('policy.cancelled', 'booking.confirmed', 'booking.released')
		   AND m.id IS NULL`, false},
	{"an inbox row of the ledger without its ledger line", `
		SELECT i.event_id::text
		  FROM inbox i
		  LEFT JOIN ledger_entries l ON l.event_id = i.event_id
		 WHERE i.consumer = 'ledger'
		   AND i.event_type IN ('policy.cancelled', 'booking.confirmed', 'booking.released')
		   AND l.id IS NULL`, false},
	// Within the inbox's retention only: older effects outlive their inbox rows.
	{"a mailbox message or ledger line without its inbox row (an effect applied outside the consumer rule)", `
		SELECT e.event_id::text
		  FROM (SELECT event_id, 'notifications' AS consumer, created_at FROM mailbox
		        UNION ALL
		        SELECT event_id, 'ledger', created_at FROM ledger_entries) e
		  LEFT JOIN inbox i ON i.consumer = e.consumer AND i.event_id = e.event_id
		 WHERE e.created_at > now() - interval '7 days'
		   AND i.event_id IS NULL`, false},
	{"a ledger day whose totals are not the sum of its lines (the day is the key)", `
		SELECT d.day::text
		  FROM ledger_days d
		  LEFT JOIN (SELECT day,
		                    count(*) FILTER (WHERE kind = 'cancellation') AS cancellations,
		                    coalesce(sum(amount) FILTER (WHERE kind = 'cancellation'), 0) AS refunds,
		                    count(*) FILTER (WHERE kind = 'booking_confirmed') AS confirmed,
		                    count(*) FILTER (WHERE kind = 'booking_released') AS released
		               FROM ledger_entries
		              GROUP BY day) l ON l.day = d.day
		 WHERE (d.cancellations, d.refunds, d.bookings_confirmed, d.bookings_released)
		       IS DISTINCT FROM (coalesce(l.cancellations, 0), coalesce(l.refunds, 0),
		                         coalesce(l.confirmed, 0), coalesce(l.released, 0))`, false},
	{"a committed event not applied by every consumer long after it was written (undelivered, or dead)", `
		SELECT o.id::text
		  FROM outbox o
		 WHERE o.created_at < now() - make_interval(secs => $1)
		   AND (SELECT count(*) FROM inbox i WHERE i.event_id = o.id) < 2`, true},
}

func checkEvents(ctx context.Context, db database.DBTX, opts Options, r *Report) error {
	for _, c := range eventChecks {
		var args []any
		if c.stale {
			if opts.StaleAfter <= 0 {
				continue
			}
			args = append(args, opts.StaleAfter.Seconds())
		}
		rows, err := db.Query(ctx, c.sql+fmt.Sprintf("\n LIMIT %d", opts.MaxIDs), args...)
		if err != nil {
			return fmt.Errorf("invariants: 9 (%s): %w", c.detail, err)
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("invariants: 9 (%s): %w", c.detail, err)
		}
		if len(keys) > 0 {
			r.OK = false
			r.Violations = append(r.Violations, Violation{Invariant: 9, Detail: c.detail, IDs: []int64{}, Keys: keys, Undelivered: c.stale})
		}
	}
	return nil
}
