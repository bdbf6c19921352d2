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
	// ErrUnknownStrategy names a strategy that does not exist.
	ErrUnknownStrategy = errors.New("slots: unknown booking strategy")
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

// Strategy is how Book decides who wins a slot. All three are correct in
// the end — the partial unique index sees to that — but they differ in how
// they get there and what a loser experiences.
type Strategy string

const (
	// ConditionalUpdate: one UPDATE … WHERE status = 'AVAILABLE'. The row
	// lock it takes serialises racers; a loser re-checks the condition after
	// the winner commits and updates 0 rows. The default.
	ConditionalUpdate Strategy = "conditional-update"
	// SelectForUpdate: lock the row first (SELECT … FOR UPDATE), look,
	// then write. Pessimistic: racers queue on the lock.
	SelectForUpdate Strategy = "select-for-update"
	// CheckThenInsert: the naive read-then-write, kept to show that without
	// a lock or a condition only the unique index stops a double booking
	// (its 23505 becomes ErrSlotTaken, never a 500).
	CheckThenInsert Strategy = "check-then-insert"
)

// Strategies lists every strategy, default first.
var Strategies = []Strategy{ConditionalUpdate, SelectForUpdate, CheckThenInsert}

// ParseStrategy returns the strategy named s ("" is the default).
func ParseStrategy(s string) (Strategy, error) {
	if s == "" {
		return ConditionalUpdate, nil
	}
	for _, st := range Strategies {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w %q (want conditional-update, select-for-update or check-then-insert)", ErrUnknownStrategy, s)
}

// Trace is what the database did for one booking attempt, for the race lab.
type Trace struct {
	Strategy Strategy `json:"strategy"`
	// RowsUpdated by the statement that decides (the conditional UPDATE, or
	// the unconditional one after a check).
	RowsUpdated int64 `json:"rows_updated"`
	// Waited is how long the deciding statement took: mostly time spent
	// waiting for another transaction's row lock or index entry.
	Waited time.Duration `json:"waited_ns"`
	// ConstraintHit: the unique index refused a second confirmed booking.
	ConstraintHit bool `json:"constraint_hit"`
}

// BookRequest is one attempt to book a slot.
type BookRequest struct {
	Strategy Strategy
	SlotID   int64
	UserID   int64
	// Think is a pause between deciding and writing (the race lab's "widen
	// the window"): it lets a person see check-then-insert race, and
	// select-for-update make others queue. ConditionalUpdate has no gap to
	// widen: deciding and writing are one statement.
	Think time.Duration
}

// Book gives the slot to the user inside tx, using the request's strategy.
// It returns the new booking, or ErrSlotTaken, or ErrNotFound for an unknown
// slot. The caller commits tx — together with the request's idempotency key,
// so the booking and the stored answer are durable together. On any error
// the caller must roll tx back.
func (s *Store) Book(ctx context.Context, tx pgx.Tx, r BookRequest) (Booking, Trace, error) {
	tr := Trace{Strategy: r.Strategy}
	var bookingID int64
	var err error
	switch r.Strategy {
	case ConditionalUpdate:
		bookingID, err = claimConditionally(ctx, tx, r.SlotID, &tr)
	case SelectForUpdate:
		bookingID, err = claimWithRowLock(ctx, tx, r.SlotID, r.Think, &tr)
	case CheckThenInsert:
		return checkThenInsert(ctx, tx, r.SlotID, r.UserID, r.Think, &tr)
	default:
		return Booking{}, tr, fmt.Errorf("%w %q", ErrUnknownStrategy, r.Strategy)
	}
	if err != nil {
		return Booking{}, tr, err
	}
	b, err := insertBooking(ctx, tx, bookingID, r.SlotID, r.UserID)
	return b, tr, err
}

// think pauses inside the transaction, on the database, as slow application
// code between a read and a write would.
func think(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, d.Seconds()); err != nil {
		return fmt.Errorf("slots: think: %w", err)
	}
	return nil
}

// claimConditionally is the whole contention story in one statement. The
// booking id is drawn from the bookings sequence in the same UPDATE, so
// status and booking_id change together (the CHECK demands it).
func claimConditionally(ctx context.Context, tx pgx.Tx, slotID int64, tr *Trace) (int64, error) {
	start := time.Now()
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
	tr.Waited = time.Since(start)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, takenOrMissing(ctx, tx, slotID)
	}
	if err != nil {
		return 0, fmt.Errorf("slots: book: %w", err)
	}
	tr.RowsUpdated = 1
	return bookingID, nil
}

// claimWithRowLock locks the slot's row, looks, then writes. Racers wait in
// the SELECT until the holder commits, then see BOOKED.
func claimWithRowLock(ctx context.Context, tx pgx.Tx, slotID int64, pause time.Duration, tr *Trace) (int64, error) {
	start := time.Now()
	var st slotState
	err := tx.QueryRow(ctx, `
		SELECT status, held_until, deposit_cents IS NOT NULL, starts_at <= now()
		  FROM slots
		 WHERE id = $1
		   FOR UPDATE -- waits while another transaction holds the row`, slotID).Scan(&st.status, &st.heldUntil, &st.deposit, &st.begun)
	tr.Waited = time.Since(start)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNotFound
	}
	if err != nil {
		return 0, fmt.Errorf("slots: book: lock slot: %w", err)
	}
	if err := st.refusal(slotID); err != nil {
		return 0, err
	}
	if err := think(ctx, tx, pause); err != nil { // others queue on our lock meanwhile
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
	tr.RowsUpdated = 1
	return bookingID, nil
}

// checkThenInsert reads without a lock and then writes unconditionally —
// the classic race. Two racers can both read AVAILABLE; the unique index on
// confirmed bookings is then all that stops the second.
func checkThenInsert(ctx context.Context, tx pgx.Tx, slotID, userID int64, pause time.Duration, tr *Trace) (Booking, Trace, error) {
	var st slotState
	err := tx.QueryRow(ctx, `
		SELECT status, held_until, deposit_cents IS NOT NULL, starts_at <= now()
		  FROM slots
		 WHERE id = $1 -- no lock: the answer may be stale by the next statement`, slotID).Scan(&st.status, &st.heldUntil, &st.deposit, &st.begun)
	if errors.Is(err, pgx.ErrNoRows) {
		return Booking{}, *tr, ErrNotFound
	}
	if err != nil {
		return Booking{}, *tr, fmt.Errorf("slots: book: read slot: %w", err)
	}
	if err := st.refusal(slotID); err != nil {
		return Booking{}, *tr, err
	}
	if err := think(ctx, tx, pause); err != nil { // others read AVAILABLE meanwhile
		return Booking{}, *tr, err
	}
	// A savepoint around the INSERT: when the unique index refuses it, only
	// the INSERT is undone, and the caller's transaction can still store the
	// answer "slot taken" with the request's key.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Booking{}, *tr, fmt.Errorf("slots: book: savepoint: %w", err)
	}
	start := time.Now()
	b, err := scanBooking(sp.QueryRow(ctx, `
		INSERT INTO bookings (slot_id, user_id)
		VALUES ($1, $2) -- the partial unique index makes a racer wait here, then fail with 23505
		RETURNING `+bookingColumns, slotID, userID))
	tr.Waited = time.Since(start)
	if isUniqueViolation(err) {
		tr.ConstraintHit = true
		if err := sp.Rollback(ctx); err != nil {
			return Booking{}, *tr, fmt.Errorf("slots: book: %w", err)
		}
		return Booking{}, *tr, ErrSlotTaken
	}
	if err != nil {
		return Booking{}, *tr, fmt.Errorf("slots: book: %w", err)
	}
	if err := sp.Commit(ctx); err != nil { // releases the savepoint; the caller commits
		return Booking{}, *tr, fmt.Errorf("slots: book: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'BOOKED',
		       booking_id = $2
		 WHERE id = $1 -- unconditional: the naive version trusts its earlier read`, slotID, b.ID)
	if err != nil {
		return Booking{}, *tr, fmt.Errorf("slots: book: mark slot: %w", err)
	}
	tr.RowsUpdated = tag.RowsAffected()
	return b, *tr, nil
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
