package events

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ledger is the consumer that keeps the books: a journal line per event
// and the per-day projection the lines add up to, both in the handler's
// transaction. A projection like this is where a duplicate would do quiet
// harm — a cancellation counted twice, a refund summed twice — which is
// why it sits behind the inbox.
type Ledger struct{}

// Name is the consumer's inbox name.
func (Ledger) Name() string { return ConsumerLedger }

// Apply books m in tx. Types it does not know are recorded in the inbox
// and otherwise ignored.
func (Ledger) Apply(ctx context.Context, tx pgx.Tx, m Message) error {
	var kind, amount string
	var at time.Time
	switch m.Type {
	case TypePolicyCancelled:
		var p PolicyCancelled
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return fmt.Errorf("ledger: %s payload: %w", m.Type, err)
		}
		kind, amount, at = "cancellation", p.RefundAmount, p.CancelledAt
	case TypeBookingConfirmed, TypeBookingReleased:
		var b BookingChanged
		if err := json.Unmarshal(m.Payload, &b); err != nil {
			return fmt.Errorf("ledger: %s payload: %w", m.Type, err)
		}
		kind, amount, at = "booking_confirmed", "0", b.At
		if m.Type == TypeBookingReleased {
			kind = "booking_released"
		}
	default:
		return nil
	}
	if at.IsZero() {
		at = m.CreatedAt
	}
	if amount == "" {
		amount = "0"
	}
	day := at.UTC().Format(time.DateOnly)
	if _, err := tx.Exec(ctx, `
		INSERT INTO ledger_entries (event_id, day, kind, amount)
		VALUES ($1, $2, $3, $4::numeric)`, m.ID, day, kind, amount); err != nil {
		return fmt.Errorf("ledger: entry: %w", err)
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO ledger_days AS d (day, cancellations, refunds, bookings_confirmed, bookings_released)
		VALUES ($1,
		        (($2 = 'cancellation')::int),
		        CASE WHEN $2 = 'cancellation' THEN $3::numeric ELSE 0 END,
		        (($2 = 'booking_confirmed')::int),
		        (($2 = 'booking_released')::int))
		    ON CONFLICT (day) DO UPDATE -- the day's row exists: add to it (the row lock serialises adders)
		   SET cancellations      = d.cancellations + excluded.cancellations,
		       refunds            = d.refunds + excluded.refunds,
		       bookings_confirmed = d.bookings_confirmed + excluded.bookings_confirmed,
		       bookings_released  = d.bookings_released + excluded.bookings_released,
		       updated_at         = now()`, day, kind, amount)
	if err != nil {
		return fmt.Errorf("ledger: day: %w", err)
	}
	return nil
}
