package slots

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Booker runs booking and release as workflows that stay in PostgreSQL:
// each opens one transaction, runs the hooks and the store's conditional
// write in it, and commits once —
//
//	BEGIN
//	  hooks.Begin        the request's Idempotency-Key is claimed
//	  conditional write  UPDATE slots … WHERE status = 'AVAILABLE'
//	  outbox.Write       booking.confirmed / booking.released, into the outbox
//	  hooks.Finish       the answer — a booking or a refusal — is stored
//	COMMIT
//
// so a crash before the commit leaves nothing, and a retry replays exactly
// what this request answered. It has the shape of policies.Canceller, whose
// work calls another system and therefore commits on each side of the call.
type Booker struct {
	pool   *pgxpool.Pool
	store  *Store
	outbox *events.Writer // writes booking.confirmed and booking.released
	// deposits books the slots that need a deposit (nil: such a booking fails).
	deposits *Deposits
}

// NewBooker returns a Booker over pool that writes its events through
// outbox.
func NewBooker(pool *pgxpool.Pool, outbox *events.Writer) *Booker {
	return &Booker{pool: pool, store: NewStore(pool), outbox: outbox}
}

// WithDeposits makes b hand slots that need a deposit, and bookings paid
// with one, to the deposit saga. It returns b.
func (b *Booker) WithDeposits(d *Deposits) *Booker {
	b.deposits = d
	return b
}

// BookSlot is one user's request for one slot.
type BookSlot struct {
	SlotID int64
	UserID int64
	// RequestKey and Actor are kept on a deposit booking's operation: the
	// key that asked for it, and who, for the timeline.
	RequestKey string
	Actor      string
}

// Book gives the slot to the user. It returns the booking; or a refusal —
// ErrSlotTaken, ErrSlotInPast, ErrNotFound, marked with workflow.Refused — that was passed
// to hooks.Finish and committed with the claim; or a failure, after which
// nothing was committed.
//
// A slot that needs a deposit is not booked here: the conditional UPDATE
// leaves it alone, the transaction rolls back (nothing was written, the key
// not claimed), and the deposit saga runs instead (Deposits.Book) — one
// wasted round trip for those slots only.
func (b *Booker) Book(ctx context.Context, req BookSlot, hooks workflow.Hooks[Booking]) (Booking, error) {
	bk, err := b.run(ctx, hooks, confirmed, func(tx pgx.Tx) (Booking, error) {
		return b.store.Book(ctx, tx, req.SlotID, req.UserID)
	})
	if errors.Is(err, errDepositRequired) && b.deposits != nil {
		return b.deposits.Book(ctx, req, req.RequestKey, hooks)
	}
	return bk, err
}

// ReleaseBooking is a request to release a booking: by its owner, or by an
// admin (AsAdmin).
type ReleaseBooking struct {
	BookingID int64
	UserID    int64
	AsAdmin   bool
	// RequestKey and Actor: as for BookSlot.
	RequestKey string
	Actor      string
}

// Release cancels the booking and frees its slot. It returns the booking,
// or a refusal — ErrBookingNotFound, ErrBookingNotConfirmed — committed with
// the claim, or a failure.
//
// A booking paid with a deposit is released by the reverse saga
// (Deposits.Cancel: refund, then release), the same way Book hands over.
func (b *Booker) Release(ctx context.Context, req ReleaseBooking, hooks workflow.Hooks[Booking]) (Booking, error) {
	bk, err := b.run(ctx, hooks, released, func(tx pgx.Tx) (Booking, error) {
		return b.store.Release(ctx, tx, req.BookingID, req.UserID, req.AsAdmin)
	})
	if errors.Is(err, errDepositRefund) && b.deposits != nil {
		return b.deposits.Cancel(ctx, CancelBooking(req), hooks)
	}
	return bk, err
}

// run is the one transaction of every booking workflow: the change and the
// event describing it commit together (the outbox: no dual write).
func (b *Booker) run(ctx context.Context, hooks workflow.Hooks[Booking], event func(Booking) events.Event, write func(pgx.Tx) (Booking, error)) (Booking, error) {
	var (
		bk      Booking
		refusal error
	)
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		var err error
		bk, err = write(tx)
		switch {
		case isRefusal(err):
			refusal = err
			return hooks.RunFinish(ctx, tx, Booking{}, err)
		case err != nil:
			return err
		}
		if _, err := b.outbox.Write(ctx, tx, event(bk)); err != nil {
			return err
		}
		return hooks.RunFinish(ctx, tx, bk, nil)
	})
	if err != nil {
		return Booking{}, err
	}
	if refusal != nil {
		return Booking{}, workflow.Refused(refusal)
	}
	return bk, nil
}

func confirmed(b Booking) events.Event { return events.NewBookingConfirmed(changed(b, b.CreatedAt)) }

func released(b Booking) events.Event { return events.NewBookingReleased(changed(b, *b.CancelledAt)) }

func changed(b Booking, at time.Time) events.BookingChanged {
	return events.BookingChanged{BookingID: b.ID, SlotID: b.SlotID, UserID: b.UserID, Resource: b.Resource, StartsAt: b.StartsAt, At: at}
}

// isRefusal reports the business "no"s of booking and release: answers, not
// failures, stored and replayed like a success.
func isRefusal(err error) bool {
	return errors.Is(err, ErrSlotTaken) || errors.Is(err, ErrSlotHeld) || errors.Is(err, ErrSlotInPast) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCancelUnderWay) ||
		errors.Is(err, ErrBookingNotFound) || errors.Is(err, ErrBookingNotConfirmed)
}
