package slots

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Violation is one slot that breaks invariant 3 of docs/invariants.md: at most one
// confirmed booking per slot, and a slot is BOOKED exactly when it has one
// (and its booking_id names that booking).
type Violation struct {
	SlotID    int64  `json:"slot_id"`
	Status    string `json:"status"`
	BookingID *int64 `json:"booking_id"`
	Confirmed int    `json:"confirmed_bookings"`
}

func (v Violation) String() string {
	held := "no booking"
	if v.BookingID != nil {
		held = fmt.Sprintf("booking %d", *v.BookingID)
	}
	return fmt.Sprintf("slot %d is %s holding %s but has %d confirmed bookings", v.SlotID, v.Status, held, v.Confirmed)
}

// CheckInvariant returns every slot that breaks invariant 3 (none, if all is
// well). It reads committed data only, so run it after the writers finish.
func (s *Store) CheckInvariant(ctx context.Context) ([]Violation, error) {
	rows, err := s.db.Query(ctx, `
		SELECT s.id, s.status, s.booking_id, count(b.id)::int
		  FROM slots s
		  LEFT JOIN bookings b
		    ON b.slot_id = s.id
		   AND b.status = 'CONFIRMED'
		 GROUP BY s.id
		HAVING count(b.id) > 1                                        -- a double booking
		    OR (s.status = 'BOOKED') <> (count(b.id) = 1)             -- BOOKED without a booking, or the reverse
		    OR (count(b.id) = 1 AND s.booking_id IS DISTINCT FROM max(b.id)) -- pointing at the wrong booking
		 ORDER BY s.id`)
	if err != nil {
		return nil, fmt.Errorf("slots: check invariant: %w", err)
	}
	v, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Violation])
	if err != nil {
		return nil, fmt.Errorf("slots: check invariant: %w", err)
	}
	return v, nil
}
