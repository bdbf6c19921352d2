package labs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemlab/idemlab/internal/slots"
)

// The race lab's three ways to decide who wins a slot. Production books
// one way only — slots.Store.Book, the conditional UPDATE; the row lock is
// slots.Store.BookWithRowLock, the documented alternative. The naive
// check-then-insert, and the pause that widens a race's window, exist here
// only: they are what the lab shows, not what the app runs.

// Strategy is how a racer decides who wins the slot.
type Strategy string

const (
	// ConditionalUpdate: one UPDATE … WHERE status = 'AVAILABLE'
	// (slots.Store.Book). The row lock it takes serialises racers; a loser
	// re-checks the condition after the winner commits and updates 0 rows.
	ConditionalUpdate Strategy = "conditional-update"
	// SelectForUpdate: lock the row first (SELECT … FOR UPDATE), look,
	// then write (slots.Store.BookWithRowLock). Pessimistic: racers queue
	// on the lock.
	SelectForUpdate Strategy = "select-for-update"
	// CheckThenInsert: the naive read-then-write, to show that without a
	// lock or a condition only the unique index stops a double booking
	// (its 23505 becomes slots.ErrSlotTaken, never a 500).
	CheckThenInsert Strategy = "check-then-insert"
)

// Strategies lists every strategy, the production one first.
var Strategies = []Strategy{ConditionalUpdate, SelectForUpdate, CheckThenInsert}

// ErrUnknownStrategy names a strategy that does not exist.
var ErrUnknownStrategy = errors.New("labs: unknown booking strategy")

// ParseStrategy returns the strategy named s ("" is the production one).
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

// Trace is what the database did for one racer's attempt.
type Trace struct {
	Strategy Strategy `json:"strategy"`
	// RowsUpdated by the statement that decides (the conditional UPDATE, or
	// the unconditional one after a check).
	RowsUpdated int64 `json:"rows_updated"`
	// Waited is how long deciding took: mostly time spent waiting for
	// another transaction's row lock or index entry.
	Waited time.Duration `json:"waited_ns"`
	// ConstraintHit: the unique index refused a second confirmed booking.
	ConstraintHit bool `json:"constraint_hit"`
}

// book is one racer's attempt in tx, the lab's tables on its search path.
// think is a pause between deciding and writing (the lab's "widen the
// window"): it lets a person see check-then-insert race, and
// select-for-update make others queue. The conditional UPDATE has no gap to
// widen: deciding and writing are one statement.
func book(ctx context.Context, tx pgx.Tx, store *slots.Store, strategy Strategy, slotID, userID int64, think time.Duration) (slots.Booking, Trace, error) {
	tr := Trace{Strategy: strategy}
	start := time.Now()
	var b slots.Booking
	var err error
	switch strategy {
	case ConditionalUpdate:
		b, err = store.Book(ctx, tx, slotID, userID)
		tr.Waited = time.Since(start)
	case SelectForUpdate:
		// Take the row lock BookWithRowLock takes and look, then pause
		// holding it: the others queue meanwhile. A racer that finds the
		// slot taken once the lock is its own does not pause — it gives up,
		// as BookWithRowLock then does — so losers wait about one think
		// time, not one each. BookWithRowLock's own lock is then ours.
		var available bool
		if err := tx.QueryRow(ctx, `
			SELECT status = 'AVAILABLE'
			  FROM slots
			 WHERE id = $1
			   FOR UPDATE -- waits while another racer holds the row`, slotID).Scan(&available); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return slots.Booking{}, tr, fmt.Errorf("labs: race: lock slot: %w", err)
		}
		tr.Waited = time.Since(start)
		if available {
			if err := thinkInTx(ctx, tx, think); err != nil {
				return slots.Booking{}, tr, err
			}
		}
		b, err = store.BookWithRowLock(ctx, tx, slotID, userID)
	case CheckThenInsert:
		return checkThenInsert(ctx, tx, slotID, userID, think, tr)
	default:
		return slots.Booking{}, tr, fmt.Errorf("%w %q", ErrUnknownStrategy, strategy)
	}
	if err == nil {
		tr.RowsUpdated = 1
	}
	return b, tr, err
}

// thinkInTx waits inside the transaction, on the database, as slow application
// code between a read and a write would.
func thinkInTx(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, d.Seconds()); err != nil {
		return fmt.Errorf("labs: race: think: %w", err)
	}
	return nil
}

// checkThenInsert reads without a lock and then writes unconditionally —
// the classic race. Two racers can both read AVAILABLE; the unique index on
// confirmed bookings is then all that stops the second.
func checkThenInsert(ctx context.Context, tx pgx.Tx, slotID, userID int64, think time.Duration, tr Trace) (slots.Booking, Trace, error) {
	var available, begun bool
	err := tx.QueryRow(ctx, `
		SELECT status = 'AVAILABLE' AND deposit_cents IS NULL, starts_at <= now()
		  FROM slots
		 WHERE id = $1 -- no lock: the answer may be stale by the next statement`, slotID).Scan(&available, &begun)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return slots.Booking{}, tr, slots.ErrNotFound
	case err != nil:
		return slots.Booking{}, tr, fmt.Errorf("labs: race: read slot: %w", err)
	case begun:
		return slots.Booking{}, tr, slots.ErrSlotInPast
	case !available:
		return slots.Booking{}, tr, slots.ErrSlotTaken
	}
	if err := thinkInTx(ctx, tx, think); err != nil { // others read AVAILABLE meanwhile
		return slots.Booking{}, tr, err
	}
	// A savepoint around the INSERT: when the unique index refuses it, only
	// the INSERT is undone and the racer's transaction ends cleanly.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return slots.Booking{}, tr, fmt.Errorf("labs: race: savepoint: %w", err)
	}
	start := time.Now()
	var b slots.Booking
	err = sp.QueryRow(ctx, `
		INSERT INTO bookings (slot_id, user_id)
		VALUES ($1, $2) -- the partial unique index makes a racer wait here, then fail with 23505
		RETURNING id, slot_id, user_id, status, created_at`, slotID, userID).
		Scan(&b.ID, &b.SlotID, &b.UserID, &b.Status, &b.CreatedAt)
	tr.Waited = time.Since(start)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		tr.ConstraintHit = true
		if err := sp.Rollback(ctx); err != nil {
			return slots.Booking{}, tr, fmt.Errorf("labs: race: %w", err)
		}
		return slots.Booking{}, tr, slots.ErrSlotTaken
	}
	if err != nil {
		return slots.Booking{}, tr, fmt.Errorf("labs: race: insert booking: %w", err)
	}
	if err := sp.Commit(ctx); err != nil { // releases the savepoint
		return slots.Booking{}, tr, fmt.Errorf("labs: race: %w", err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'BOOKED',
		       booking_id = $2
		 WHERE id = $1 -- unconditional: the naive version trusts its earlier read`, slotID, b.ID)
	if err != nil {
		return slots.Booking{}, tr, fmt.Errorf("labs: race: mark slot: %w", err)
	}
	tr.RowsUpdated = tag.RowsAffected()
	return b, tr, nil
}
