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
}

// Store reads and writes slots and bookings.
type Store struct {
	db database.DBTX
}

// NewStore returns a Store over db.
func NewStore(db database.DBTX) *Store { return &Store{db: db} }

// ListFilter narrows List. Status "" means any; AfterID is the cursor.
type ListFilter struct {
	Status  string
	AfterID int64
	Limit   int
}

// List returns slots in id order (the seed creates them in time order).
func (s *Store) List(ctx context.Context, f ListFilter) ([]Slot, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, resource, starts_at, ends_at, status, booking_id
		  FROM slots
		 WHERE ($1 = '' OR status = $1)
		   AND id > $2
		 ORDER BY id
		 LIMIT $3`, f.Status, f.AfterID, f.Limit)
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
		SELECT id, resource, starts_at, ends_at, status, booking_id
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
