package fake

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
)

// Options tune a Payments: HoldCap, Logger and Control (who may use the
// control API; the zero value admits loopback callers only).
type Options = fault.Options

// Payments is the fake payments service: its HTTP API over its durable state
// in the fake_payments schema, and its faults in the shared fault schema
// (system 'payments'). Several Payments on one database are one service.
// Close, Faults, SetFaults and Reset are fault.Service's.
type Payments struct {
	fault.Service
}

// New returns a Payments keeping its state in pool's database, which must be
// migrated (migrations 00020, 00021). Give it a pool of its own: an external
// system shares nothing with the app but the database server. Faults are
// scoped by policy or by booking.
func New(pool *pgxpool.Pool, opts Options) *Payments {
	return &Payments{fault.NewService(pool, "payments", []string{"policy", "booking"}, []string{
		`DELETE FROM fake_payments.ledger`,
		`DELETE FROM fake_payments.refunds`,
		`DELETE FROM fake_payments.charges`,
		webhooks.Forget(),
	}, opts)}
}

// Handler returns the service's HTTP API:
//
//	POST /v1/charges          charge (Idempotency-Key, Request-Deadline)
//	GET  /v1/charges/{key}    the truth of a charge key
//	POST /v1/refunds          refund a charge or a policy's premium
//	GET  /v1/refunds/{key}    the truth of a refund key
//
// and its control API, behind Options.Control:
//
//	GET  /v1/ledger           every money movement, totals, late arrivals
//	GET  /v1/faults           the fault configuration
//	PUT  /v1/faults           set one fault (global, override or script)
//	POST /v1/reset            forget everything, restore the defaults
//	GET  /v1/webhooks         the callback setting and the webhook outbox
//	PUT  /v1/webhooks         set how callbacks are sent (fault.WebhookSettings)
func (p *Payments) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", p.handleCharge)
	mux.HandleFunc("GET /v1/charges/{key}", p.handleChargeStatus)
	mux.HandleFunc("POST /v1/refunds", p.handleRefund)
	mux.HandleFunc("GET /v1/refunds/{key}", p.handleRefundStatus)
	p.Register(mux, "/v1/ledger", p.handleLedger)
	fault.WebhookAPI{Service: p.Service, Outbox: webhooks}.Register(mux)
	return mux
}

// Webhooks is the service's webhook outbox, for its sender.
func (p *Payments) Webhooks() fault.Outbox { return webhooks }

// MaxAmountCents bounds one charge or refund (1,000,000.00).
const MaxAmountCents = 100_000_000

// handleCharge is POST /v1/charges with {"policy_id" or "booking_id",
// "amount_cents", "description"}; the steps are every fake's
// (fault.Calls.Serve).
func (p *Payments) handleCharge(w http.ResponseWriter, r *http.Request) {
	var body struct {
		PolicyID    *int64 `json:"policy_id"`
		BookingID   *int64 `json:"booking_id"`
		AmountCents int64  `json:"amount_cents"`
		Description string `json:"description"`
	}
	key, deadline, ok := fault.ReadCall(w, r, &body)
	if !ok {
		return
	}
	if (body.PolicyID == nil) == (body.BookingID == nil) || !validID(body.PolicyID) || !validID(body.BookingID) ||
		!validAmount(body.AmountCents) {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request",
			`body must be {"policy_id" or "booking_id": <positive id>, "amount_cents": 1 to 100000000, "description": "…"}`)
		return
	}
	c := charge{key: key, policyID: body.PolicyID, bookingID: body.BookingID, amount: body.AmountCents, description: body.Description}
	p.Calls.Serve(w, r, fault.Arrival{Key: key, Subject: c.subject(), Deadline: deadline},
		func(ctx context.Context, f fault.Call) (fault.Record, error) {
			c.fault = f
			return p.receiveCharge(ctx, c)
		},
		func(ctx context.Context) (fault.Record, error) {
			ch, err := readCharge(ctx, p.Pool, key)
			return ch.record(), err
		})
}

// handleRefund is POST /v1/refunds with {"charge_key" or "policy_id",
// "amount_cents", "reason"}.
func (p *Payments) handleRefund(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ChargeKey   *string `json:"charge_key"`
		PolicyID    *int64  `json:"policy_id"`
		AmountCents int64   `json:"amount_cents"`
		Reason      string  `json:"reason"`
	}
	key, deadline, ok := fault.ReadCall(w, r, &body)
	if !ok {
		return
	}
	if (body.ChargeKey == nil) == (body.PolicyID == nil) || !validID(body.PolicyID) ||
		(body.ChargeKey != nil && !external.ValidKey(*body.ChargeKey)) || !validAmount(body.AmountCents) {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request",
			`body must be {"charge_key": "<key>" or "policy_id": <positive id>, "amount_cents": 1 to 100000000, "reason": "…"}`)
		return
	}
	rf := refund{key: key, chargeKey: body.ChargeKey, policyID: body.PolicyID, amount: body.AmountCents, reason: body.Reason}
	subject, err := p.refundSubject(r.Context(), rf)
	if err != nil {
		fault.InternalError(p.Log, w, err)
		return
	}
	p.Calls.Serve(w, r, fault.Arrival{Key: key, Subject: subject, Deadline: deadline},
		func(ctx context.Context, f fault.Call) (fault.Record, error) {
			rf.fault = f
			return p.receiveRefund(ctx, rf)
		},
		func(ctx context.Context) (fault.Record, error) {
			re, err := readRefund(ctx, p.Pool, key)
			return re.record(), err
		})
}

// handleChargeStatus is GET /v1/charges/{key}.
func (p *Payments) handleChargeStatus(w http.ResponseWriter, r *http.Request) {
	p.Calls.ServeStatus(w, r, func(ctx context.Context, key string) (any, bool, error) {
		ch, err := readCharge(ctx, p.Pool, key)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, nil
		}
		return ch, err == nil, err
	})
}

// handleRefundStatus is GET /v1/refunds/{key}.
func (p *Payments) handleRefundStatus(w http.ResponseWriter, r *http.Request) {
	p.Calls.ServeStatus(w, r, func(ctx context.Context, key string) (any, bool, error) {
		re, err := readRefund(ctx, p.Pool, key)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, nil
		}
		return re, err == nil, err
	})
}

// handleLedger is GET /v1/ledger.
func (p *Payments) handleLedger(w http.ResponseWriter, r *http.Request) {
	l, err := p.Ledger(r.Context())
	if err != nil {
		fault.InternalError(p.Log, w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, l)
}

func validID(id *int64) bool   { return id == nil || (*id > 0 && *id <= fault.MaxID) }
func validAmount(a int64) bool { return a >= 1 && a <= MaxAmountCents }
