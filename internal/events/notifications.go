package events

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Notifications is the consumer that tells customers what happened: one
// mailbox message per event, shown on the Events page and to the customer.
type Notifications struct{}

// Name is the consumer's inbox name.
func (Notifications) Name() string { return ConsumerNotifications }

// Apply writes the customer's message for m in tx. Types it does not know
// are recorded in the inbox and otherwise ignored.
func (Notifications) Apply(ctx context.Context, tx pgx.Tx, m Message) error {
	var userID int64
	var subject, body string
	switch m.Type {
	case TypePolicyCancelled:
		var p PolicyCancelled
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return fmt.Errorf("notifications: %s payload: %w", m.Type, err)
		}
		userID = p.UserID
		subject = fmt.Sprintf("Policy %s is cancelled", p.PolicyNumber)
		body = fmt.Sprintf("Your policy %s is cancelled. A refund of %s is on its way (reference %s).",
			p.PolicyNumber, p.RefundAmount, p.RefundKey)
	case TypeBookingConfirmed, TypeBookingReleased:
		var b BookingChanged
		if err := json.Unmarshal(m.Payload, &b); err != nil {
			return fmt.Errorf("notifications: %s payload: %w", m.Type, err)
		}
		userID = b.UserID
		what := "confirmed"
		if m.Type == TypeBookingReleased {
			what = "released"
		}
		subject = fmt.Sprintf("Booking %d %s", b.BookingID, what)
		body = fmt.Sprintf("Your booking %d of %s at %s is %s.",
			b.BookingID, b.Resource, b.StartsAt.UTC().Format("Mon 2 Jan 15:04 MST"), what)
	default:
		return nil
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO mailbox (user_id, event_id, subject, body)
		VALUES ($1, $2, $3, $4)`, userID, m.ID, subject, body)
	if err != nil {
		return fmt.Errorf("notifications: mailbox: %w", err)
	}
	return nil
}
