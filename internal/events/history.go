package events

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// History is the consumer that needs order: a projection of each
// aggregate (histories: its version and the state its last event left it
// in) that must come out as the events happened — booking:7 held, then
// confirmed, then released ends "released", never "confirmed" because the
// release overtook the confirmation on its way.
//
// No transport promises that order to it (docs/events.md, "Order per
// aggregate"): redeliveries, Nak'd or snoozed deliveries, two relays and
// several instances all let a later event of an aggregate arrive first. So
// the consumer checks each event's place (Message.Seq) against the
// aggregate's version, under the aggregate's row lock:
//
//	seq = version + 1   the next one: apply it, then every parked successor
//	                    that is now next, in order
//	seq > version + 1   early: park it (kept, not applied, not dropped)
//	seq ≤ version       seen: nothing to do
//
// all in the consumer rule's transaction, so a parked event commits with
// its inbox row and is applied, later, in the transaction of the
// predecessor that makes it next.
type History struct{}

// Name is the consumer's inbox name.
func (History) Name() string { return ConsumerHistory }

// Apply places m in its aggregate's history, in tx.
func (History) Apply(ctx context.Context, tx pgx.Tx, m Message) error {
	if m.Seq <= 0 {
		return nil // written before events had a place: nothing to order it by
	}
	// The aggregate's row, locked to the end of tx: two deliveries of one
	// aggregate (two instances, two transports' copies) take turns here, so
	// one that parks an event commits before the other looks for it.
	if _, err := tx.Exec(ctx, `
		INSERT INTO histories (key)
		VALUES ($1)
		    ON CONFLICT DO NOTHING -- it has a row already (a concurrent insert is waited for)`, m.Key); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	var version int64
	if err := tx.QueryRow(ctx, `
		SELECT version
		  FROM histories
		 WHERE key = $1
		   FOR UPDATE -- the aggregate's deliveries take turns`, m.Key).Scan(&version); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	switch {
	case m.Seq <= version:
		return nil // its place is taken by itself: a copy the inbox no longer remembers
	case m.Seq > version+1:
		_, err := tx.Exec(ctx, `
			INSERT INTO history_parked (key, seq, event_id, type, payload, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)
			    ON CONFLICT DO NOTHING -- parked already`, m.Key, m.Seq, m.ID, m.Type, m.Payload, m.CreatedAt)
		if err != nil {
			return fmt.Errorf("history: park: %w", err)
		}
		return nil
	}
	last := m.Type
	if err := applyInHistory(ctx, tx, m.Key, m.Seq, m.ID.String(), m.Type, nil); err != nil {
		return err
	}
	version = m.Seq
	for { // its parked successors, while the next one is there
		var id, typ string
		var parkedAt time.Time
		err := tx.QueryRow(ctx, `
			DELETE FROM history_parked
			 WHERE key = $1
			   AND seq = $2
			RETURNING event_id::text, type, parked_at`, m.Key, version+1).Scan(&id, &typ, &parkedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			return fmt.Errorf("history: unpark: %w", err)
		}
		if err := applyInHistory(ctx, tx, m.Key, version+1, id, typ, &parkedAt); err != nil {
			return err
		}
		version, last = version+1, typ
	}
	_, err := tx.Exec(ctx, `
		UPDATE histories
		   SET version = $2,
		       state = $3,
		       updated_at = now()
		 WHERE key = $1`, m.Key, version, HistoryState(last))
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}

// applyInHistory appends one event at its place.
func applyInHistory(ctx context.Context, tx pgx.Tx, key string, seq int64, id, typ string, parkedAt *time.Time) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO history_events (key, seq, event_id, type, parked_at)
		VALUES ($1, $2, $3, $4, $5)`, key, seq, id, typ, parkedAt)
	if err != nil {
		return fmt.Errorf("history: apply %s at %s #%d: %w", typ, key, seq, err)
	}
	return nil
}

// HistoryState is the state an event of type typ leaves its aggregate in:
// what follows the aggregate in the type ("booking.released" → "released").
func HistoryState(typ string) string {
	_, state, _ := strings.Cut(typ, ".")
	return state
}
