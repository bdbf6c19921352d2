package slots

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/workflow"
)

// This file is the deposit saga's two external steps: what each asks of the
// payments service. The engine decides when they run and records them.

// chargeDeposit is charge_deposit's call: the payments service charges the
// booking's deposit under the step's key.
type chargeDeposit struct{ client payments.Client }

// chargeCall is charge_deposit's request, stored with the step.
type chargeCall struct {
	BookingID   int64  `json:"booking_id"`
	AmountCents int64  `json:"amount_cents"`
	Description string `json:"description"`
}

func (chargeDeposit) System() string { return "payments" }

// Request reads the deposit the booking owes, once; every retry charges it.
func (chargeDeposit) Request(ctx context.Context, tx pgx.Tx, op workflow.Operation) (any, error) {
	var c chargeCall
	var resource string
	var startsAt time.Time
	err := tx.QueryRow(ctx, `
		SELECT b.id, b.deposit_cents, s.resource, s.starts_at
		  FROM bookings b
		  JOIN slots s ON s.id = b.slot_id
		 WHERE b.id = $1`, op.BookingID).Scan(&c.BookingID, &c.AmountCents, &resource, &startsAt)
	if err != nil {
		return nil, fmt.Errorf("slots: deposit of booking %d: %w", op.BookingID, err)
	}
	c.Description = fmt.Sprintf("deposit for booking %d: %s, %s", c.BookingID, resource, startsAt.UTC().Format("Mon 2 Jan 15:04"))
	return c, nil
}

func (p chargeDeposit) Deadline() time.Time { return p.client.Deadline() }

func (p chargeDeposit) Send(ctx context.Context, call workflow.Call) (external.Result, error) {
	var req chargeCall
	if err := json.Unmarshal(call.Request, &req); err != nil {
		return external.Result{}, fmt.Errorf("slots: charge_deposit request: %w", err)
	}
	return p.client.Charge(ctx, payments.ChargeRequest{Key: call.Key, BookingID: req.BookingID, AmountCents: req.AmountCents,
		Description: req.Description, Deadline: call.Deadline})
}

func (p chargeDeposit) Status(ctx context.Context, key string) (external.Truth, error) {
	return p.client.ChargeStatus(ctx, key)
}

// refundDeposit is refund_deposit's call: the payments service refunds the
// deposit charged for the booking, naming that charge by its key.
type refundDeposit struct{ client payments.Client }

// refundCall is refund_deposit's request, stored with the step.
type refundCall struct {
	BookingID   int64  `json:"booking_id"`
	ChargeKey   string `json:"charge_key"`
	AmountCents int64  `json:"amount_cents"`
	Reason      string `json:"reason"`
}

func (refundDeposit) System() string { return "payments" }

// errNoCharge: a refund was about to be asked for a booking whose charge is
// not DONE. Unreachable while only a charged booking is CONFIRMED; it is
// the rule "no refund without a charge" said in code.
var errNoCharge = errors.New("slots: no charge DONE for the booking: nothing to refund")

// Request names the charge to refund: the charge_deposit step DONE of the
// booking's BOOK_DEPOSIT operation — its key is the charge's identity at
// the payments service. Computed once; every retry sends it verbatim.
func (refundDeposit) Request(ctx context.Context, tx pgx.Tx, op workflow.Operation) (any, error) {
	r := refundCall{BookingID: op.BookingID}
	err := tx.QueryRow(ctx, `
		SELECT s.step_key, b.deposit_cents
		  FROM bookings b
		  JOIN operations o ON o.booking_id = b.id AND o.operation_type = 'BOOK_DEPOSIT'
		  JOIN operation_steps s ON s.operation_id = o.id AND s.run = o.run AND s.name = 'charge_deposit'
		 WHERE b.id = $1
		   AND s.state = 'DONE' -- only a charge known to exist is refunded`, op.BookingID).Scan(&r.ChargeKey, &r.AmountCents)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w (booking %d)", errNoCharge, op.BookingID)
	}
	if err != nil {
		return nil, fmt.Errorf("slots: refund of booking %d: %w", op.BookingID, err)
	}
	r.Reason = fmt.Sprintf("booking %d cancelled", op.BookingID)
	return r, nil
}

func (p refundDeposit) Deadline() time.Time { return p.client.Deadline() }

func (p refundDeposit) Send(ctx context.Context, call workflow.Call) (external.Result, error) {
	var req refundCall
	if err := json.Unmarshal(call.Request, &req); err != nil {
		return external.Result{}, fmt.Errorf("slots: refund_deposit request: %w", err)
	}
	return p.client.Refund(ctx, payments.RefundRequest{Key: call.Key, ChargeKey: req.ChargeKey, AmountCents: req.AmountCents,
		Reason: req.Reason, Deadline: call.Deadline})
}

func (p refundDeposit) Status(ctx context.Context, key string) (external.Truth, error) {
	return p.client.RefundStatus(ctx, key)
}
