package slots

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Booking statuses.
const (
	BookingPending   = "PENDING" // a deposit booking holding its slot while the deposit is charged
	BookingConfirmed = "CONFIRMED"
	BookingCancelled = "CANCELLED"
	BookingFailed    = "FAILED" // its deposit was refused (or known never charged); the hold was released
)

var (
	// ErrSlotTaken: someone else holds the slot. It is an outcome, not a
	// fault: the API answers 409 slot-taken and stores it like any outcome.
	ErrSlotTaken = errors.New("slots: the slot is already booked")
	// ErrSlotHeld: a deposit booking holds the slot while its deposit is
	// charged. Returned as a *SlotHeldError saying until when; distinct
	// from ErrSlotTaken, since the slot may come free again.
	ErrSlotHeld = errors.New("slots: the slot is held for another booking while its deposit is charged")
	// ErrSlotInPast: the slot has begun (its start is not after the
	// database's now()), so it can no longer be booked or held. An outcome
	// too: 409 slot-in-past, stored with the key.
	ErrSlotInPast = errors.New("slots: the slot has already begun")
	// ErrBookingNotFound is returned for an unknown booking and for another
	// customer's booking alike.
	ErrBookingNotFound = errors.New("slots: booking not found")
	// ErrBookingNotConfirmed: the booking was already released.
	ErrBookingNotConfirmed = errors.New("slots: the booking is no longer confirmed")
)

// SlotHeldError is ErrSlotHeld with the hold's intended end.
type SlotHeldError struct {
	SlotID int64
	Until  time.Time
}

func (e *SlotHeldError) Error() string {
	return fmt.Sprintf("slots: slot %d is held for another booking while its deposit is charged, until %s at the latest "+
		"unless the charge's outcome is still unknown then", e.SlotID, e.Until.UTC().Format(time.RFC3339))
}

func (e *SlotHeldError) Unwrap() error { return ErrSlotHeld }

// errDepositRequired: the slot is free but needs a deposit, so a plain
// booking does not take it; Booker hands the request to the deposit saga.
// It is never an answer.
var errDepositRequired = errors.New("slots: the slot needs a deposit")

// errDepositRefund: the booking was paid with a deposit, so releasing it is
// the reverse saga (refund, then release). Never an answer.
var errDepositRefund = errors.New("slots: the booking's deposit is refunded first")

// Booking is one user's hold on one slot.
type Booking struct {
	ID          int64      `json:"id"`
	SlotID      int64      `json:"slot_id"`
	UserID      int64      `json:"user_id"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"created_at"`
	CancelledAt *time.Time `json:"cancelled_at"`
	// The slot's resource and start, read with the booking (its events and
	// pages name the slot without another query).
	Resource string    `json:"resource"`
	StartsAt time.Time `json:"starts_at"`
	// DepositCents is the deposit the booking owes (nil: none needed).
	DepositCents *int64 `json:"deposit_cents,omitempty"`
	// Operation is the deposit saga's operation when the answer is about
	// one (booking or cancelling a deposit booking); not a column.
	Operation *workflow.Operation `json:"operation,omitempty" db:"-"`
}

// bookingColumns are a booking's columns in Booking's order, for RETURNING
// and SELECT alike; the slot's resource and start ride along as scalar
// subqueries on its primary key, in the same statement.
const bookingColumns = `id, slot_id, user_id, status, created_at, cancelled_at,
		       (SELECT resource FROM slots WHERE slots.id = bookings.slot_id),
		       (SELECT starts_at FROM slots WHERE slots.id = bookings.slot_id),
		       deposit_cents`

func scanBooking(row pgx.Row) (Booking, error) {
	var b Booking
	err := row.Scan(&b.ID, &b.SlotID, &b.UserID, &b.Status, &b.CreatedAt, &b.CancelledAt, &b.Resource, &b.StartsAt, &b.DepositCents)
	return b, err
}

// Book gives the slot to the user inside tx: one conditional UPDATE decides
// who wins (claimConditionally). It returns the new booking, or
// ErrSlotTaken, ErrSlotInPast, or ErrNotFound for an unknown slot. The
// caller commits tx — together with the request's idempotency key, so the
// booking and the stored answer are durable together. On any error the
// caller must roll tx back.
func (s *Store) Book(ctx context.Context, tx pgx.Tx, slotID, userID int64) (Booking, error) {
	bookingID, err := claimConditionally(ctx, tx, slotID)
	if err != nil {
		return Booking{}, err
	}
	return insertBooking(ctx, tx, bookingID, slotID, userID)
}

// BookWithRowLock is Book the pessimistic way: lock the slot's row (SELECT
// … FOR UPDATE), look, then write. Racers queue on the lock instead of
// re-checking a condition; the answers are Book's. The app books with
// Book — one statement decides, no lock is held across a round trip — and
// this stays as the documented, tested alternative (docs/booking.md; the
// race lab runs both).
func (s *Store) BookWithRowLock(ctx context.Context, tx pgx.Tx, slotID, userID int64) (Booking, error) {
	bookingID, err := claimWithRowLock(ctx, tx, slotID)
	if err != nil {
		return Booking{}, err
	}
	return insertBooking(ctx, tx, bookingID, slotID, userID)
}

// claimConditionally is the whole contention story in one statement. The
// booking id is drawn from the bookings sequence in the same UPDATE, so
// status and booking_id change together (the CHECK demands it).
func claimConditionally(ctx context.Context, tx pgx.Tx, slotID int64) (int64, error) {
	var bookingID int64
	err := tx.QueryRow(ctx, `
		UPDATE slots
		   SET status = 'BOOKED',
		       booking_id = nextval(pg_get_serial_sequence('bookings', 'id'))
		 WHERE id = $1
		   AND status = 'AVAILABLE' -- 0 rows: someone else took it (or no such slot) …
		   AND deposit_cents IS NULL -- … or it needs a deposit: the deposit saga books it …
		   AND starts_at > now()     -- … or it has begun: the past is not for sale
		RETURNING booking_id`, slotID).Scan(&bookingID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, takenOrMissing(ctx, tx, slotID)
	}
	if err != nil {
		return 0, fmt.Errorf("slots: book: %w", err)
	}
	return bookingID, nil
}

// claimWithRowLock locks the slot's row, looks, then writes. Racers wait in
// the SELECT until the holder commits, then see BOOKED.
func claimWithRowLock(ctx context.Context, tx pgx.Tx, slotID int64) (int64, error) {
	var st slotState
	err := tx.QueryRow(ctx, `
		SELECT status, held_until, deposit_cents IS NOT NULL, starts_at <= now()
		  FROM slots
		 WHERE id = $1
		   FOR UPDATE -- waits while another transaction holds the row`, slotID).Scan(&st.status, &st.heldUntil, &st.deposit, &st.begun)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("slots: book: lock slot: %w", err)
	}
	if err := st.refusal(slotID); err != nil {
		return 0, err
	}
	var bookingID int64
	err = tx.QueryRow(ctx, `
		UPDATE slots
		   SET status = 'BOOKED',
		       booking_id = nextval(pg_get_serial_sequence('bookings', 'id'))
		 WHERE id = $1 -- safe without a condition: we hold the row lock
		RETURNING booking_id`, slotID).Scan(&bookingID)
	if err != nil {
		return 0, fmt.Errorf("slots: book: %w", err)
	}
	return bookingID, nil
}

func insertBooking(ctx context.Context, tx pgx.Tx, bookingID, slotID, userID int64) (Booking, error) {
	b, err := scanBooking(tx.QueryRow(ctx, `
		INSERT INTO bookings (id, slot_id, user_id)
		VALUES ($1, $2, $3)
		RETURNING `+bookingColumns, bookingID, slotID, userID))
	if isUniqueViolation(err) {
		// Unreachable while the slot row lock is held; the index is the
		// last line of defence should it ever be reached.
		return Booking{}, ErrSlotTaken
	}
	if err != nil {
		return Booking{}, fmt.Errorf("slots: insert booking: %w", err)
	}
	return b, nil
}

// slotState is what a booking attempt that could not take a slot reads of it.
type slotState struct {
	status    string
	heldUntil *time.Time
	deposit   bool
	begun     bool // starts_at <= now(): too late to book or hold
}

// refusal says why a plain booking cannot take the slot now (nil: it can).
// A slot that needs a deposit, in any state, is the deposit saga's to
// answer for: the request may be the very one that holds it, come back.
func (st slotState) refusal(slotID int64) error {
	switch {
	case st.begun:
		return ErrSlotInPast
	case st.deposit:
		return errDepositRequired
	case st.status != StatusAvailable:
		return ErrSlotTaken
	}
	return nil
}

// holdRefusal says why the deposit saga's hold could not take the slot.
func (st slotState) holdRefusal(slotID int64) error {
	if st.begun {
		return ErrSlotInPast
	}
	if st.status == StatusHeld {
		return &SlotHeldError{SlotID: slotID, Until: *st.heldUntil}
	}
	// BOOKED — or free again already (released since the UPDATE looked):
	// losing that race is the same answer as any other.
	return ErrSlotTaken
}

// takenOrMissing tells why a conditional UPDATE matched nothing: no such
// slot, booked, or needing a deposit.
func takenOrMissing(ctx context.Context, db database.DBTX, slotID int64) error {
	st, err := readSlotState(ctx, db, slotID)
	if err != nil {
		return err
	}
	if err := st.refusal(slotID); err != nil {
		return err
	}
	return ErrSlotTaken // free again already: someone released it since; a retry may win it
}

func readSlotState(ctx context.Context, db database.DBTX, slotID int64) (slotState, error) {
	var st slotState
	err := db.QueryRow(ctx, `
		SELECT status, held_until, deposit_cents IS NOT NULL, starts_at <= now()
		  FROM slots
		 WHERE id = $1`, slotID).Scan(&st.status, &st.heldUntil, &st.deposit, &st.begun)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, ErrNotFound
	}
	if err != nil {
		return st, fmt.Errorf("slots: book: %w", err)
	}
	return st, nil
}

// Release cancels a confirmed booking and frees its slot, in tx. Only the
// booking's owner may release it, or an admin (asAdmin). Another customer's
// booking is ErrBookingNotFound, so ids reveal nothing.
func (s *Store) Release(ctx context.Context, tx pgx.Tx, bookingID, userID int64, asAdmin bool) (Booking, error) {
	b, err := scanBooking(tx.QueryRow(ctx, `
		UPDATE bookings
		   SET status = 'CANCELLED',
		       cancelled_at = now()
		 WHERE id = $1
		   AND (user_id = $2 OR $3) -- owner or admin
		   AND status = 'CONFIRMED' -- 0 rows: released already, or not yours …
		   AND deposit_cents IS NULL -- … or paid with a deposit: the reverse saga releases it
		RETURNING `+bookingColumns, bookingID, userID, asAdmin))
	if errors.Is(err, pgx.ErrNoRows) {
		return Booking{}, s.whyNotReleasable(ctx, tx, bookingID, userID, asAdmin)
	}
	if err != nil {
		return Booking{}, fmt.Errorf("slots: release: %w", err)
	}
	_, err = tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'AVAILABLE',
		       booking_id = NULL
		 WHERE id = $1
		   AND booking_id = $2 -- only if this booking still holds the slot`, b.SlotID, b.ID)
	if err != nil {
		return Booking{}, fmt.Errorf("slots: release: free slot: %w", err)
	}
	return b, nil
}

func (s *Store) whyNotReleasable(ctx context.Context, tx pgx.Tx, bookingID, userID int64, asAdmin bool) error {
	var status string
	var deposit bool
	err := tx.QueryRow(ctx, `
		SELECT status, deposit_cents IS NOT NULL
		  FROM bookings
		 WHERE id = $1
		   AND (user_id = $2 OR $3)`, bookingID, userID, asAdmin).Scan(&status, &deposit)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrBookingNotFound
	}
	if err != nil {
		return fmt.Errorf("slots: release: %w", err)
	}
	if status == BookingConfirmed && deposit {
		return errDepositRefund
	}
	return ErrBookingNotConfirmed
}

// GetBooking returns one of the user's bookings (any booking for an admin).
func (s *Store) GetBooking(ctx context.Context, bookingID, userID int64, asAdmin bool) (Booking, error) {
	b, err := scanBooking(s.db.QueryRow(ctx, `
		SELECT `+bookingColumns+`
		  FROM bookings
		 WHERE id = $1
		   AND (user_id = $2 OR $3)`, bookingID, userID, asAdmin))
	if errors.Is(err, pgx.ErrNoRows) {
		return Booking{}, ErrBookingNotFound
	}
	if err != nil {
		return Booking{}, fmt.Errorf("slots: get booking: %w", err)
	}
	return b, nil
}

// isUniqueViolation reports PostgreSQL's 23505, translated here at the store
// so no caller ever sees a driver error for an expected outcome.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// BookingFilter narrows ListBookings to one user's bookings. Status ""
// means any; AfterID is the cursor.
type BookingFilter struct {
	UserID  int64
	Status  string
	AfterID int64
	Limit   int
}

// ListBookings returns the user's bookings in id order.
func (s *Store) ListBookings(ctx context.Context, f BookingFilter) ([]Booking, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+bookingColumns+`
		  FROM bookings
		 WHERE user_id = $1
		   AND ($2 = '' OR status = $2)
		   AND id > $3
		 ORDER BY id
		 LIMIT $4`, f.UserID, f.Status, f.AfterID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("slots: list bookings: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Booking])
	if err != nil {
		return nil, fmt.Errorf("slots: list bookings: %w", err)
	}
	return list, nil
}
