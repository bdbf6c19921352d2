package events

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Store reads what the Events page and the admin API show. It writes
// nothing: events are written by Write, moved by the relay and applied by
// the consumers.
type Store struct {
	db database.DBTX
}

// NewStore returns a store over db.
func NewStore(db database.DBTX) *Store { return &Store{db: db} }

// Overview is the outbox and the consumers at a glance.
type Overview struct {
	Transport string `json:"transport"`
	Pending   int64  `json:"pending"`
	Sent      int64  `json:"sent"`
	Dead      int64  `json:"dead"`
	// OldestPendingSeconds is the age of the oldest unsent row (0: none).
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// Consumers: what each consumer saw and caught.
	Consumers []ConsumerStats `json:"consumers"`
	// BrokerDuplicates: publishes the broker dropped inside its dedupe window.
	BrokerDuplicates int64 `json:"broker_duplicates"`
	// Transports: what each transport's events met, layer by layer — every
	// transport this build has, including those not in use now (the
	// database keeps the deliveries of a run on another transport).
	Transports []TransportStats `json:"transports"`
	// History is the ordered consumer's projection (history.go).
	History HistoryStats `json:"history"`
}

// HistoryStats says how often order had to be restored: events that
// arrived before their predecessor, parked and applied after it, and those
// waiting now (after heal, none: invariant 10).
type HistoryStats struct {
	Aggregates        int64 `json:"aggregates"`
	ParkedNow         int64 `json:"parked_now"`
	ParkedThenApplied int64 `json:"parked_then_applied"`
}

// TransportStats counts one transport's duplicates by the layer that
// caught them.
type TransportStats struct {
	Transport string `json:"transport"`
	// BrokerDuplicates: repeats the layer before the consumers refused (a
	// publish inside JetStream's window, a task create refused by name).
	BrokerDuplicates int64 `json:"broker_duplicates"`
	// InboxDuplicates: deliveries an inbox recognised and applied nothing for.
	InboxDuplicates int64 `json:"inbox_duplicates"`
	Applied         int64 `json:"applied"`
}

// ConsumerStats counts one consumer's deliveries by outcome.
type ConsumerStats struct {
	Consumer string `json:"consumer"`
	Applied  int64  `json:"applied"`
	// Duplicates: deliveries its inbox recognised and applied nothing for.
	Duplicates int64 `json:"duplicates"`
	Deferred   int64 `json:"deferred"`
	Failed     int64 `json:"failed"`
}

// Overview counts the outbox by status and the deliveries by consumer.
func (s *Store) Overview(ctx context.Context) (Overview, error) {
	var o Overview
	err := s.db.QueryRow(ctx, `
		SELECT c.transport, o.pending, o.sent, o.dead, o.oldest, p.dups
		  FROM events_config c,
		       (SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending,
		               count(*) FILTER (WHERE status = 'SENT') AS sent,
		               count(*) FILTER (WHERE status = 'DEAD') AS dead,
		               coalesce(extract(epoch FROM clock_timestamp()
		                        - min(created_at) FILTER (WHERE status = 'PENDING')), 0) AS oldest
		          FROM outbox) o,
		       (SELECT count(*) AS dups FROM event_publishes WHERE duplicate) p`).
		Scan(&o.Transport, &o.Pending, &o.Sent, &o.Dead, &o.OldestPendingSeconds, &o.BrokerDuplicates)
	if err != nil {
		return o, fmt.Errorf("events: overview: %w", err)
	}
	byName := map[string]*ConsumerStats{}
	for _, c := range Consumers {
		o.Consumers = append(o.Consumers, ConsumerStats{Consumer: c})
	}
	for i := range o.Consumers {
		byName[o.Consumers[i].Consumer] = &o.Consumers[i]
	}
	rows, err := s.db.Query(ctx, `
		SELECT consumer, outcome, count(*)
		  FROM event_deliveries
		 GROUP BY consumer, outcome`)
	if err != nil {
		return o, fmt.Errorf("events: overview: %w", err)
	}
	var consumer, outcome string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&consumer, &outcome, &n}, func() error {
		cs := byName[consumer]
		if cs == nil {
			return nil
		}
		switch outcome {
		case OutcomeApplied:
			cs.Applied = n
		case OutcomeDuplicate:
			cs.Duplicates = n
		case OutcomeDeferred:
			cs.Deferred = n
		case OutcomeFailed:
			cs.Failed = n
		}
		return nil
	})
	if err != nil {
		return o, fmt.Errorf("events: overview: %w", err)
	}
	if o.Transports, err = s.byTransport(ctx); err != nil {
		return o, fmt.Errorf("events: overview: %w", err)
	}
	err = s.db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM histories),
		       (SELECT count(*) FROM history_parked),
		       (SELECT count(*) FROM history_events WHERE parked_at IS NOT NULL)`).
		Scan(&o.History.Aggregates, &o.History.ParkedNow, &o.History.ParkedThenApplied)
	if err != nil {
		return o, fmt.Errorf("events: overview: history: %w", err)
	}
	return o, nil
}

// byTransport counts, per transport, the duplicates each layer caught.
func (s *Store) byTransport(ctx context.Context) ([]TransportStats, error) {
	rows, err := s.db.Query(ctx, `
		SELECT t.transport,
		       coalesce(p.dups, 0),
		       coalesce(d.dups, 0),
		       coalesce(d.applied, 0)
		  FROM unnest($1::text[]) WITH ORDINALITY AS t(transport, n)
		  LEFT JOIN (SELECT transport, count(*) FILTER (WHERE duplicate) AS dups
		               FROM event_publishes
		              GROUP BY transport) p USING (transport)
		  LEFT JOIN (SELECT transport,
		                    count(*) FILTER (WHERE outcome = 'duplicate') AS dups,
		                    count(*) FILTER (WHERE outcome = 'applied') AS applied
		               FROM event_deliveries
		              GROUP BY transport) d USING (transport)
		 ORDER BY t.n`, Transports)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[TransportStats])
}

// EventRow is one outbox row with what became of it.
type EventRow struct {
	ID        uuid.UUID  `json:"id"`
	Type      string     `json:"type"`
	Key       string     `json:"key"`
	Transport string     `json:"transport"`
	Status    string     `json:"status"`
	Attempts  int        `json:"attempts"`
	LastError *string    `json:"last_error"`
	CreatedAt time.Time  `json:"created_at"`
	SentAt    *time.Time `json:"sent_at"`
	// Publishes are the relay's publishes of it (none on River).
	Publishes []Publish `json:"publishes"`
	// Deliveries are every arrival at a consumer, oldest first.
	Deliveries []DeliveryRow `json:"deliveries"`
}

// Publish is one publish by the relay.
type Publish struct {
	At        time.Time `json:"at"`
	Instance  string    `json:"instance"`
	Duplicate bool      `json:"duplicate"` // the broker's dedupe window dropped it
	Injected  *string   `json:"injected"`
}

// DeliveryRow is one arrival of an event at a consumer.
type DeliveryRow struct {
	At       time.Time `json:"at"`
	Consumer string    `json:"consumer"`
	Instance string    `json:"instance"`
	Attempt  int       `json:"attempt"`
	Outcome  string    `json:"outcome"`
	CaughtBy *string   `json:"caught_by"`
	Injected *string   `json:"injected"`
	Detail   string    `json:"detail"`
}

// ListFilter narrows Recent. Status "" is every status.
type ListFilter struct {
	Status string
	Limit  int
}

// Recent returns the newest events (of a status) with their publishes and
// deliveries.
func (s *Store) Recent(ctx context.Context, f ListFilter) ([]EventRow, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, type, key, transport, status, attempts, last_error, created_at, sent_at
		  FROM outbox
		 WHERE ($1 = '' OR status = $1)
		 ORDER BY created_at DESC
		 LIMIT $2`, f.Status, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("events: recent: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventRow, error) {
		var e EventRow
		err := r.Scan(&e.ID, &e.Type, &e.Key, &e.Transport, &e.Status, &e.Attempts, &e.LastError, &e.CreatedAt, &e.SentAt)
		return e, err
	})
	if err != nil || len(list) == 0 {
		return list, err
	}
	ids := make([]uuid.UUID, len(list))
	at := map[uuid.UUID]int{}
	for i, e := range list {
		ids[i], at[e.ID] = e.ID, i
	}
	rows, err = s.db.Query(ctx, `
		SELECT event_id, at, instance, duplicate, injected
		  FROM event_publishes
		 WHERE event_id = ANY($1)
		 ORDER BY id`, ids)
	if err != nil {
		return nil, fmt.Errorf("events: publishes: %w", err)
	}
	var id uuid.UUID
	var p Publish
	if _, err := pgx.ForEachRow(rows, []any{&id, &p.At, &p.Instance, &p.Duplicate, &p.Injected}, func() error {
		list[at[id]].Publishes = append(list[at[id]].Publishes, p)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("events: publishes: %w", err)
	}
	rows, err = s.db.Query(ctx, `
		SELECT event_id, at, consumer, instance, attempt, outcome, caught_by, injected, detail
		  FROM event_deliveries
		 WHERE event_id = ANY($1)
		 ORDER BY id`, ids)
	if err != nil {
		return nil, fmt.Errorf("events: deliveries: %w", err)
	}
	var d DeliveryRow
	if _, err := pgx.ForEachRow(rows, []any{&id, &d.At, &d.Consumer, &d.Instance, &d.Attempt, &d.Outcome,
		&d.CaughtBy, &d.Injected, &d.Detail}, func() error {
		list[at[id]].Deliveries = append(list[at[id]].Deliveries, d)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("events: deliveries: %w", err)
	}
	return list, nil
}

// MailMessage is one message in a customer's mailbox.
type MailMessage struct {
	ID        int64     `json:"id"`
	EventID   uuid.UUID `json:"event_id"`
	Subject   string    `json:"subject"`
	Body      string    `json:"body"`
	CreatedAt time.Time `json:"created_at"`
}

// Mailbox returns a user's newest messages.
func (s *Store) Mailbox(ctx context.Context, userID int64, limit int) ([]MailMessage, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, event_id, subject, body, created_at
		  FROM mailbox
		 WHERE user_id = $1
		 ORDER BY id DESC
		 LIMIT $2`, userID, limit)
	if err != nil {
		return nil, fmt.Errorf("events: mailbox: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[MailMessage])
	if err != nil {
		return nil, fmt.Errorf("events: mailbox: %w", err)
	}
	return list, nil
}

// LedgerDay is one day of the ledger's projection.
type LedgerDay struct {
	Day               time.Time `json:"day"`
	Cancellations     int       `json:"cancellations"`
	Refunds           string    `json:"refunds"`
	BookingsConfirmed int       `json:"bookings_confirmed"`
	BookingsReleased  int       `json:"bookings_released"`
}

// Ledger returns the newest days of the projection.
func (s *Store) Ledger(ctx context.Context, limit int) ([]LedgerDay, error) {
	rows, err := s.db.Query(ctx, `
		SELECT day, cancellations, refunds::text, bookings_confirmed, bookings_released
		  FROM ledger_days
		 ORDER BY day DESC
		 LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("events: ledger: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[LedgerDay])
	if err != nil {
		return nil, fmt.Errorf("events: ledger: %w", err)
	}
	return list, nil
}
