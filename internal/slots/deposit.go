package slots

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/workflow"
)

// The deposit saga (docs/saga.md). A slot that needs a deposit spans two
// systems — this database and the payments service — so booking it cannot
// be one transaction. It is two workflows on the step engine, with the same
// types, fencing and recovery loop as the policy cancellation:
//
//	BOOK_DEPOSIT    hold ─► charge_deposit ─► confirm
//	                 │        │ refused, or NOT_STARTED once the hold's time is up
//	                 │        └──► the hold's Undo: slot AVAILABLE, booking FAILED
//	                 └ slot HELD, booking PENDING, booking.held — one commit
//	CANCEL_DEPOSIT  request_cancel ─► refund_deposit ─► release_slot
//
// Compensation — releasing the hold — happens only when the charge is known
// not to exist: a definite refusal, or NOT_STARTED after every deadline. An
// unknown charge (no answer, a 5xx, RUNNING) keeps the hold, past its
// held_until if need be, while recovery asks, polls, and in the end a
// person decides. A timer running out is never a reason to compensate.

// The deposit saga's operation types and steps.
const (
	OperationBookDeposit   = "BOOK_DEPOSIT"
	OperationCancelDeposit = "CANCEL_DEPOSIT"

	StepHold          = "hold"
	StepChargeDeposit = "charge_deposit"
	StepConfirm       = "confirm"
	// the booking's compensation, when a person cancels it after the charge
	StepRefundCharge     = "refund_charge"
	StepReleaseCancelled = "release_cancelled"

	StepRequestCancel = "request_cancel"
	StepRefundDeposit = "refund_deposit"
	StepReleaseSlot   = "release_slot"
)

// DefaultHold is how long a hold is meant to last (DEPOSIT_HOLD).
const DefaultHold = 10 * time.Minute

var (
	// ErrDepositDeclined: the payments service refused the deposit; the
	// hold was released and the booking is FAILED. Not a refusal of the
	// request — an outcome, stored with it.
	ErrDepositDeclined = errors.New("slots: the deposit was declined: the hold was released and the booking failed")
	// ErrRefundRefused: the payments service refused the deposit's refund;
	// the booking stays CONFIRMED and its slot BOOKED.
	ErrRefundRefused = errors.New("slots: the deposit's refund was refused: the booking stays confirmed")
	// ErrCancelUnderWay: the booking already has a cancellation that has
	// not failed. Returned as a *CancelUnderWayError naming it.
	ErrCancelUnderWay = errors.New("slots: the booking already has a cancellation under way")
)

// CancelUnderWayError names the cancellation that already exists.
type CancelUnderWayError struct {
	OperationID int64
	Status      string
}

func (e *CancelUnderWayError) Error() string {
	return fmt.Sprintf("slots: the booking already has cancellation %d (%s)", e.OperationID, e.Status)
}

func (e *CancelUnderWayError) Unwrap() error { return ErrCancelUnderWay }

func (d *Deposits) bookDeposit(pay payments.Client) workflow.Definition {
	return workflow.Definition{
		Type: OperationBookDeposit,
		Steps: []workflow.Step{
			// written by startHold; undone when the charge is known not to exist
			{Name: StepHold, Undo: d.releaseHold},
			{Name: StepChargeDeposit, Call: chargeDeposit{pay}, Refused: workflow.FailOperation, Abandon: holdTimeIsUp},
			{Name: StepConfirm, Do: d.confirmHold},
		},
		// Cancelled by a person once the charge went through: the charge
		// is refunded under its own key, then the hold is let go. A
		// refused refund leaves the money taken: a person decides.
		Compensation: []workflow.Step{
			{Name: StepRefundCharge, Call: refundDeposit{pay}, Refused: workflow.Reconcile},
			{Name: StepReleaseCancelled, Do: d.releaseCancelled},
		},
	}
}

func (d *Deposits) cancelDeposit(pay payments.Client) workflow.Definition {
	return workflow.Definition{
		Type: OperationCancelDeposit,
		Steps: []workflow.Step{
			{Name: StepRequestCancel}, // written by startCancel
			// A refused refund leaves the booking as it was: nothing to undo.
			{Name: StepRefundDeposit, Call: refundDeposit{pay}, Refused: workflow.FailOperation},
			{Name: StepReleaseSlot, Do: d.releaseRefunded},
		},
	}
}

// DepositCrashPoints lists where a process running the deposit saga can be
// made to die (CRASH_AT, PUT /api/v1/admin/crash), booking then cancelling;
// after_commit, which both pass, once.
var DepositCrashPoints = UniquePoints(workflow.CrashPoints((&Deposits{}).bookDeposit(nil)), workflow.CrashPoints((&Deposits{}).cancelDeposit(nil)))

// UniquePoints concatenates lists of crash points, each point once, in the
// order first met.
func UniquePoints(lists ...[]crash.Point) []crash.Point {
	var out []crash.Point
	for _, p := range slices.Concat(lists...) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// Deposits runs the deposit saga on the workflow engine.
type Deposits struct {
	engine *workflow.Engine
	outbox *events.Writer // writes the booking's events
	hold   time.Duration
}

// NewDeposits registers both workflows of the deposit saga with engine,
// charging and refunding through pay and writing the booking's events
// through outbox. A hold is meant to last hold (DefaultHold when ≤ 0).
func NewDeposits(engine *workflow.Engine, pay payments.Client, outbox *events.Writer, hold time.Duration) *Deposits {
	if hold <= 0 {
		hold = DefaultHold
	}
	d := &Deposits{engine: engine, outbox: outbox, hold: hold}
	engine.Register(d.bookDeposit(pay))
	engine.Register(d.cancelDeposit(pay))
	return d
}

// Book runs a deposit booking for one request and returns the booking as
// committed, its operation attached: CONFIRMED (the deposit charged),
// FAILED (declined: the hold released), or PENDING (the charge's outcome
// unknown: the slot stays HELD and recovery finds out). The commits:
//
//	tx 1:  hooks.Begin · hold: slot HELD, booking PENDING, booking.held,
//	       the operation IN_PROGRESS · charge_deposit SENT with its deadline
//	       ── no transaction open: the payments service's own commit ──
//	tx 2:  charge_deposit DONE · confirm: booking CONFIRMED, slot BOOKED,
//	       booking.confirmed · SUCCEEDED · hooks.Finish
//	   or  charge_deposit FAILED · the hold undone: slot AVAILABLE, booking
//	       FAILED, booking.hold_released · FAILED · hooks.Finish
//	   or  charge_deposit UNKNOWN · handed to recovery · hooks.Finish
//
// Refusals decided in tx 1 — *SlotHeldError, ErrSlotTaken, ErrNotFound —
// go to hooks.Finish there, commit with the claim, and are returned
// wrapped in workflow.Refused.
func (d *Deposits) Book(ctx context.Context, req BookSlot, requestKey string, hooks workflow.Hooks[Booking]) (Booking, error) {
	var bk Booking
	_, err := d.engine.Start(ctx, OperationBookDeposit, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		return d.startHold(ctx, tx, req, requestKey, owner)
	}, bookingHooks(hooks, &bk))
	return bk, err
}

// bookingHooks adapts a booking request's hooks to the engine's: Finish
// answers with the booking as the transaction has it, its operation attached.
func bookingHooks(hooks workflow.Hooks[Booking], answer *Booking) workflow.Hooks[workflow.Operation] {
	return workflow.Hooks[workflow.Operation]{
		Begin: hooks.Begin,
		Finish: func(ctx context.Context, tx pgx.Tx, op workflow.Operation, refusal error) error {
			if refusal != nil {
				return hooks.RunFinish(ctx, tx, Booking{}, refusal)
			}
			bk, err := scanBooking(tx.QueryRow(ctx, `SELECT `+bookingColumns+` FROM bookings WHERE id = $1`, op.BookingID))
			if err != nil {
				return fmt.Errorf("slots: the operation's booking: %w", err)
			}
			bk.Operation = &op
			*answer = bk
			return hooks.RunFinish(ctx, tx, bk, nil)
		},
	}
}

// sqlHold is the hold, the PENDING booking and the operation in one
// statement: the conditional UPDATE decides who holds the slot, as for a
// plain booking, and the booking's id is drawn in it.
var sqlHold = `
WITH held AS (
    UPDATE slots
       SET status = 'HELD',
           held_until = now() + make_interval(secs => $3),
           booking_id = nextval(pg_get_serial_sequence('bookings', 'id'))
     WHERE id = $1
       AND status = 'AVAILABLE' -- 0 rows: someone holds or booked it (or no such slot)
       AND deposit_cents IS NOT NULL -- the saga is for slots that need a deposit
       AND starts_at > now() -- 0 rows too: it has begun
    RETURNING id, booking_id, deposit_cents
), booking AS (
    INSERT INTO bookings (id, slot_id, user_id, status, deposit_cents)
    SELECT booking_id, id, $2, 'PENDING', deposit_cents
      FROM held
    RETURNING id
)
INSERT INTO operations (booking_id, operation_type, user_id, idempotency_key, status,
                        owner_token, owner_id, lease_expires_at)
SELECT id, 'BOOK_DEPOSIT', $2, $4, 'IN_PROGRESS',
       gen_random_uuid(), $5, now() + make_interval(secs => $6)
  FROM booking
RETURNING ` + workflow.OperationColumns

// startHold is the hold: the slot HELD for a new PENDING booking, its
// event, and the operation owned by this request — all in tx. The request
// that started an existing hold, come back with its key, gets its
// operation with existing true.
func (d *Deposits) startHold(ctx context.Context, tx pgx.Tx, req BookSlot, requestKey string, owner workflow.Owner) (workflow.Operation, bool, error) {
	op, err := workflow.ScanOperation(tx.QueryRow(ctx, sqlHold, req.SlotID, req.UserID, d.hold.Seconds(),
		requestKey, owner.ID, owner.Lease.Seconds()))
	if err == nil {
		bk, err := scanBooking(tx.QueryRow(ctx, `SELECT `+bookingColumns+` FROM bookings WHERE id = $1`, op.BookingID))
		if err != nil {
			return workflow.Operation{}, false, fmt.Errorf("slots: hold: %w", err)
		}
		if _, err := d.outbox.Write(ctx, tx, events.NewBookingHeld(changed(bk, bk.CreatedAt))); err != nil {
			return workflow.Operation{}, false, err
		}
		return op, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return workflow.Operation{}, false, fmt.Errorf("slots: hold: %w", err)
	}
	if requestKey != "" {
		existing, err := workflow.ScanOperation(tx.QueryRow(ctx, `
			SELECT `+workflow.OperationColumns+`
			  FROM operations
			 WHERE operation_type = 'BOOK_DEPOSIT'
			   AND user_id = $1
			   AND idempotency_key = $2
			   AND booking_id IN (SELECT id FROM bookings WHERE slot_id = $3)`, req.UserID, requestKey, req.SlotID))
		if err == nil {
			return existing, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return workflow.Operation{}, false, fmt.Errorf("slots: hold: %w", err)
		}
	}
	st, err := readSlotState(ctx, tx, req.SlotID)
	if err == nil {
		err = st.holdRefusal(req.SlotID)
	}
	if isRefusal(err) {
		return workflow.Operation{}, false, workflow.Refused(err)
	}
	return workflow.Operation{}, false, err
}

// releaseHold is the hold's Undo — the compensation. It runs only in the
// transaction that records the charge FAILED (refused, or known never
// made), so the slot is freed exactly when the charge is known not to exist.
func (d *Deposits) releaseHold(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	bk, err := scanBooking(tx.QueryRow(ctx, `
		UPDATE bookings
		   SET status = 'FAILED',
		       cancelled_at = now()
		 WHERE id = $1
		   AND status = 'PENDING' -- a hold is released once
		RETURNING `+bookingColumns, op.BookingID))
	if err != nil {
		return "", fmt.Errorf("slots: release hold of booking %d: %w", op.BookingID, err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'AVAILABLE',
		       booking_id = NULL,
		       held_until = NULL
		 WHERE id = $1
		   AND booking_id = $2
		   AND status = 'HELD' -- only this booking's hold`, bk.SlotID, bk.ID)
	if err != nil {
		return "", fmt.Errorf("slots: release hold of booking %d: %w", bk.ID, err)
	}
	if tag.RowsAffected() != 1 {
		return "", fmt.Errorf("slots: booking %d does not hold slot %d", bk.ID, bk.SlotID)
	}
	if _, err := d.outbox.Write(ctx, tx, events.NewBookingHoldReleased(changed(bk, *bk.CancelledAt))); err != nil {
		return "", err
	}
	return fmt.Sprintf("slot %d AVAILABLE again, booking %d FAILED (booking.hold_released in the outbox)", bk.SlotID, bk.ID), nil
}

// releaseCancelled is the booking's last compensation: the charge is
// refunded, so the PENDING booking is CANCELLED and its hold let go, with
// booking.hold_released, in the transaction that records the refund DONE.
func (d *Deposits) releaseCancelled(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	bk, err := scanBooking(tx.QueryRow(ctx, `
		UPDATE bookings
		   SET status = 'CANCELLED',
		       cancelled_at = now()
		 WHERE id = $1
		   AND status = 'PENDING' -- a hold is let go once
		RETURNING `+bookingColumns, op.BookingID))
	if err != nil {
		return "", fmt.Errorf("slots: release cancelled booking %d: %w", op.BookingID, err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'AVAILABLE',
		       booking_id = NULL,
		       held_until = NULL
		 WHERE id = $1
		   AND booking_id = $2
		   AND status = 'HELD' -- only this booking's hold`, bk.SlotID, bk.ID); err != nil {
		return "", fmt.Errorf("slots: release cancelled booking %d: %w", bk.ID, err)
	}
	if _, err := d.outbox.Write(ctx, tx, events.NewBookingHoldReleased(changed(bk, *bk.CancelledAt))); err != nil {
		return "", err
	}
	return fmt.Sprintf("deposit refunded: booking %d CANCELLED, slot %d AVAILABLE again (booking.hold_released in the outbox)", bk.ID, bk.SlotID), nil
}

// holdTimeIsUp is the charge's Abandon: asked only once the charge is known
// never to have been made (NOT_STARTED, every deadline passed). While the
// hold's time lasts, the same charge is sent again; once it is up, the hold
// is released instead. The slot's row is locked so the answer holds for
// the transaction that acts on it.
func holdTimeIsUp(ctx context.Context, tx pgx.Tx, op workflow.Operation, at *time.Time) (string, error) {
	var up bool
	var until *time.Time
	err := tx.QueryRow(ctx, `
		SELECT held_until <= `+database.Now(2)+`, held_until
		  FROM slots
		 WHERE booking_id = $1
		   AND status = 'HELD'
		   FOR UPDATE -- the answer stands until this transaction ends`, op.BookingID, at).Scan(&up, &until)
	if err != nil {
		return "", fmt.Errorf("slots: hold of booking %d: %w", op.BookingID, err)
	}
	if !up {
		return "", nil
	}
	return "the hold's time ran out at " + until.UTC().Format(time.RFC3339), nil
}

// confirmHold is confirm: the deposit is charged, so the booking is
// CONFIRMED and its slot BOOKED, with booking.confirmed, in the transaction
// that records the charge DONE.
func (d *Deposits) confirmHold(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	bk, err := scanBooking(tx.QueryRow(ctx, `
		UPDATE bookings
		   SET status = 'CONFIRMED'
		 WHERE id = $1
		   AND status = 'PENDING' -- confirmed once
		RETURNING `+bookingColumns, op.BookingID))
	if err != nil {
		return "", fmt.Errorf("slots: confirm booking %d: %w", op.BookingID, err)
	}
	tag, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'BOOKED',
		       held_until = NULL
		 WHERE id = $1
		   AND booking_id = $2
		   AND status = 'HELD' -- the hold becomes the booking`, bk.SlotID, bk.ID)
	if err != nil {
		return "", fmt.Errorf("slots: confirm booking %d: %w", bk.ID, err)
	}
	if tag.RowsAffected() != 1 {
		return "", fmt.Errorf("slots: booking %d does not hold slot %d", bk.ID, bk.SlotID)
	}
	if _, err := d.outbox.Write(ctx, tx, events.NewBookingConfirmed(changed(bk, time.Now().UTC()))); err != nil {
		return "", err
	}
	return fmt.Sprintf("booking %d CONFIRMED, slot %d BOOKED (booking.confirmed in the outbox)", bk.ID, bk.SlotID), nil
}

// CancelBooking is a request to cancel a deposit booking.
type CancelBooking struct {
	BookingID  int64
	UserID     int64
	AsAdmin    bool
	RequestKey string
	Actor      string
}

// Cancel runs the reverse saga for one request: refund the deposit under
// its own step key, then release the slot. It returns the booking as
// committed, its operation attached: CANCELLED (refunded, released),
// CONFIRMED with the operation FAILED (the refund refused), or CONFIRMED
// with the operation IN_PROGRESS (the refund's outcome unknown: recovery
// finds out; the slot is released only once the refund is DONE). Refusals —
// ErrBookingNotFound, ErrBookingNotConfirmed, *CancelUnderWayError — commit
// with the claim.
func (d *Deposits) Cancel(ctx context.Context, req CancelBooking, hooks workflow.Hooks[Booking]) (Booking, error) {
	var bk Booking
	_, err := d.engine.Start(ctx, OperationCancelDeposit, req.Actor, func(ctx context.Context, tx pgx.Tx, owner workflow.Owner) (workflow.Operation, bool, error) {
		return startCancel(ctx, tx, req, owner)
	}, bookingHooks(hooks, &bk))
	return bk, err
}

var sqlStartCancel = `
INSERT INTO operations (booking_id, operation_type, user_id, idempotency_key, status,
                        owner_token, owner_id, lease_expires_at)
SELECT id, 'CANCEL_DEPOSIT', user_id, $4, 'IN_PROGRESS',
       gen_random_uuid(), $5, now() + make_interval(secs => $6)
  FROM bookings
 WHERE id = $1
   AND (user_id = $2 OR $3) -- owner or admin
   AND status = 'CONFIRMED'
   AND deposit_cents IS NOT NULL
    ON CONFLICT (booking_id, operation_type) WHERE booking_id IS NOT NULL DO NOTHING -- a cancellation exists already: 0 rows
RETURNING ` + workflow.OperationColumns

// startCancel is request_cancel: the intent to cancel the booking, owned by
// owner, in tx. A FAILED earlier cancellation (its refund refused) is
// started again, next run.
func startCancel(ctx context.Context, tx pgx.Tx, req CancelBooking, owner workflow.Owner) (workflow.Operation, bool, error) {
	op, err := workflow.ScanOperation(tx.QueryRow(ctx, sqlStartCancel, req.BookingID, req.UserID, req.AsAdmin,
		req.RequestKey, owner.ID, owner.Lease.Seconds()))
	if err == nil {
		return op, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return workflow.Operation{}, false, fmt.Errorf("slots: start cancel: %w", err)
	}
	existing, err := workflow.ScanOperation(tx.QueryRow(ctx, `
		SELECT `+workflow.OperationColumns+`
		  FROM operations
		 WHERE booking_id = $1
		   AND operation_type = 'CANCEL_DEPOSIT'
		   AND (user_id = $2 OR $3)`, req.BookingID, req.UserID, req.AsAdmin))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// no cancellation: no such booking of this user, or not CONFIRMED
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM bookings WHERE id = $1 AND (user_id = $2 OR $3)`,
			req.BookingID, req.UserID, req.AsAdmin).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return workflow.Operation{}, false, workflow.Refused(ErrBookingNotFound)
		}
		if err != nil {
			return workflow.Operation{}, false, fmt.Errorf("slots: start cancel: %w", err)
		}
		return workflow.Operation{}, false, workflow.Refused(ErrBookingNotConfirmed)
	case err != nil:
		return workflow.Operation{}, false, fmt.Errorf("slots: start cancel: %w", err)
	case req.RequestKey != "" && existing.IdempotencyKey == req.RequestKey:
		return existing, true, nil
	case existing.Status == workflow.StatusSucceeded:
		return workflow.Operation{}, false, workflow.Refused(ErrBookingNotConfirmed)
	case existing.Status != workflow.StatusFailed:
		return workflow.Operation{}, false, workflow.Refused(&CancelUnderWayError{OperationID: existing.ID, Status: existing.Status})
	}
	op, ok, err := workflow.Restart(ctx, tx, existing.ID, req.RequestKey, nil, owner)
	if err != nil {
		return workflow.Operation{}, false, fmt.Errorf("slots: restart cancel: %w", err)
	}
	if !ok {
		return workflow.Operation{}, false, workflow.Refused(&CancelUnderWayError{OperationID: existing.ID, Status: workflow.StatusInProgress})
	}
	return op, false, nil
}

// releaseRefunded is release_slot: the deposit is refunded, so the booking
// is CANCELLED and its slot free, with booking.released, in the
// transaction that records the refund DONE.
func (d *Deposits) releaseRefunded(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {
	bk, err := scanBooking(tx.QueryRow(ctx, `
		UPDATE bookings
		   SET status = 'CANCELLED',
		       cancelled_at = now()
		 WHERE id = $1
		   AND status = 'CONFIRMED' -- released once
		RETURNING `+bookingColumns, op.BookingID))
	if err != nil {
		return "", fmt.Errorf("slots: release booking %d: %w", op.BookingID, err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE slots
		   SET status = 'AVAILABLE',
		       booking_id = NULL
		 WHERE id = $1
		   AND booking_id = $2 -- only if this booking still holds the slot`, bk.SlotID, bk.ID); err != nil {
		return "", fmt.Errorf("slots: release booking %d: %w", bk.ID, err)
	}
	if _, err := d.outbox.Write(ctx, tx, events.NewBookingReleased(changed(bk, *bk.CancelledAt))); err != nil {
		return "", err
	}
	return fmt.Sprintf("booking %d CANCELLED, slot %d AVAILABLE (booking.released in the outbox)", bk.ID, bk.SlotID), nil
}
