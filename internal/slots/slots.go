// Package slots owns bookable slots and their bookings: two different
// requests that want the same thing (contention), not one request repeated.
package slots

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Slot statuses.
const (
	StatusAvailable = "AVAILABLE"
	StatusHeld      = "HELD" // a deposit booking holds it while its deposit is charged
	StatusBooked    = "BOOKED"
)

// ErrNotFound is returned for an unknown slot.
var ErrNotFound = errors.New("slots: not found")

// Slot is one bookable period of one resource. BookingID names the
// confirmed booking holding it, exactly when Status is BOOKED.
type Slot struct {
	ID        int64     `json:"id"`
	Resource  string    `json:"resource"`
	StartsAt  time.Time `json:"starts_at"`
	EndsAt    time.Time `json:"ends_at"`
	Status    string    `json:"status"`
	BookingID *int64    `json:"booking_id"`
	// DepositCents is the deposit booking it needs (nil: none): the deposit
	// saga books it (deposit.go).
	DepositCents *int64 `json:"deposit_cents"`
	// HeldUntil is set exactly when the slot is HELD: until when its hold
	// is meant to last. Past it, the hold still stands while its charge is
	// unknown — it is released only when the charge is known not to exist.
	HeldUntil *time.Time `json:"held_until"`
}

// slotColumns are a slot's columns in Slot's order.
const slotColumns = `id, resource, starts_at, ends_at, status, booking_id, deposit_cents, held_until`

// Store reads and writes slots and bookings.
type Store struct {
	db database.DBTX
}

// NewStore returns a Store over db.
func NewStore(db database.DBTX) *Store { return &Store{db: db} }

// ListFilter narrows List. Status "" means any; AfterID is the cursor.
type ListFilter struct {
	Status string
	// Deposit, when set, keeps only the slots that need a deposit (true)
	// or only those that do not (false).
	Deposit *bool
	AfterID int64
	Limit   int
}

// List returns slots in id order (the seed creates them in time order).
func (s *Store) List(ctx context.Context, f ListFilter) ([]Slot, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+slotColumns+`
		  FROM slots
		 WHERE ($1 = '' OR status = $1)
		   AND ($4::boolean IS NULL OR (deposit_cents IS NOT NULL) = $4)
		   AND id > $2
		 ORDER BY id
		 LIMIT $3`, f.Status, f.AfterID, f.Limit, f.Deposit)
	if err != nil {
		return nil, fmt.Errorf("slots: list: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Slot])
	if err != nil {
		return nil, fmt.Errorf("slots: list: %w", err)
	}
	return list, nil
}

// Get returns slot id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Slot, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+slotColumns+`
		  FROM slots
		 WHERE id = $1`, id)
	if err != nil {
		return Slot{}, fmt.Errorf("slots: get: %w", err)
	}
	sl, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Slot])
	if errors.Is(err, pgx.ErrNoRows) {
		return Slot{}, ErrNotFound
	}
	if err != nil {
		return Slot{}, fmt.Errorf("slots: get: %w", err)
	}
	return sl, nil
}
