package invariants

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
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
		   AND (SELECT count(*) FROM inbox i WHERE i.event_id = o.id) < $2`, true},
}

// Invariant 10's half for events (DESIGN.md): a consumer that needs order
// sees one aggregate's events in their order. The history consumer
// (events.History) is that consumer; its projection must be the ordered
// fold of its events, each applied at its own place. Keys are aggregates
// or event ids.
var orderChecks = []struct {
	detail string
	sql    string
	stale  bool
}{
	{"two events of one aggregate at the same place (the writers' counter did not serialise them; keys are aggregates)", `
		SELECT key
		  FROM outbox
		 GROUP BY key, seq
		HAVING count(*) > 1`, false},
	// The fold: applied 1..version with no gap, and the state the last one says.
	{"a history that is not the ordered fold of its events (version, gap or state; keys are aggregates)", `
		SELECT h.key
		  FROM histories h
		  LEFT JOIN LATERAL (SELECT count(*) AS applied, coalesce(max(seq), 0) AS last
		                       FROM history_events e
		                      WHERE e.key = h.key) c ON true
		  LEFT JOIN history_events l ON l.key = h.key AND l.seq = h.version
		 WHERE h.version <> c.applied
		    OR h.version <> c.last
		    OR h.state IS DISTINCT FROM substr(l.type, strpos(l.type, '.') + 1)`, false},
	{"an event the history applied at a place other than its own (out of its aggregate's order)", `
		SELECT e.event_id::text
		  FROM history_events e
		  JOIN outbox o ON o.id = e.event_id
		 WHERE o.seq <> e.seq
		    OR o.key <> e.key`, false},
	{"an event parked by the history long after it was written (its predecessor never came)", `
		SELECT event_id::text
		  FROM history_parked
		 WHERE created_at < now() - make_interval(secs => $1)`, true},
	{"an aggregate whose history lags its events long after they were written (keys are aggregates)", `
		SELECT o.key
		  FROM outbox o
		  LEFT JOIN histories h ON h.key = o.key
		 WHERE o.created_at < now() - make_interval(secs => $1)
		 GROUP BY o.key
		HAVING max(o.seq) > coalesce(max(h.version), 0)`, true},
}

func checkEvents(ctx context.Context, db database.DBTX, opts Options, r *Report) error {
	for _, c := range eventChecks {
		var args []any
		if c.stale {
			if opts.StaleAfter <= 0 {
				continue
			}
			args = append(args, opts.StaleAfter.Seconds(), len(events.Consumers))
		}
		if err := checkKeys(ctx, db, 9, c.detail, c.sql, opts, r, c.stale, args...); err != nil {
			return err
		}
	}
	for _, c := range orderChecks {
		var args []any
		if c.stale {
			if opts.StaleAfter <= 0 {
				continue
			}
			args = append(args, opts.StaleAfter.Seconds())
		}
		if err := checkKeys(ctx, db, 10, c.detail, c.sql, opts, r, c.stale, args...); err != nil {
			return err
		}
	}
	return nil
}

// checkKeys runs one check whose offending rows are named by text keys.
// An "after heal" check's violation is events still on their way
// (Violation.Undelivered).
func checkKeys(ctx context.Context, db database.DBTX, invariant int, detail, sql string, opts Options, r *Report, stale bool, args ...any) error {
	rows, err := db.Query(ctx, sql+fmt.Sprintf("\n LIMIT %d", opts.MaxIDs), args...)
	if err != nil {
		return fmt.Errorf("invariants: %d (%s): %w", invariant, detail, err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("invariants: %d (%s): %w", invariant, detail, err)
	}
	if len(keys) > 0 {
		r.OK = false
		r.Violations = append(r.Violations, Violation{Invariant: invariant, Detail: detail, IDs: []int64{}, Keys: keys, Undelivered: stale})
	}
	return nil
}
