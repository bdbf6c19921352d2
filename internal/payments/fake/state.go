package fake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
)

// This file is the payments service's durable state: every SQL statement it
// runs on the fake_payments schema. The order of the steps (record the key,
// count a repeat, apply the movement) is fault.Process's, shared with the
// provider; charge and refund are the two fault.Keyed this service brings.

// The service's tables of key records.
var (
	charges = fault.NewTable("fake_payments", "charges")
	refunds = fault.NewTable("fake_payments", "refunds")
	// webhooks is its outbox of callbacks, for charges and refunds alike.
	webhooks = fault.NewOutbox("fake_payments", "payments")
)

// charge is one charge call. It is for a policy or for a booking (a deposit).
type charge struct {
	key                 string
	policyID, bookingID *int64
	amount              int64
	description         string
	fault               fault.Call
}

var _ fault.Keyed = charge{}

func (c charge) subject() fault.Subject {
	if c.policyID != nil {
		return fault.Policy(*c.policyID)
	}
	return fault.Booking(*c.bookingID)
}

// Accepted: the charge's mode carries it out (now, or after slow_ms).
func (c charge) Accepted() bool { return c.fault.Accepted() }

const declined = "the card was declined (fault mode reject)"

// InsertFirst records the first call with the key.
func (c charge) InsertFirst(ctx context.Context, tx pgx.Tx) (bool, error) {
	outcome, reason := "ACCEPTED", (*string)(nil)
	if !c.Accepted() {
		outcome, reason = "REJECTED", new(declined)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO fake_payments.charges (idempotency_key, policy_id, booking_id, amount_cents, description,
		                                   outcome, reject_reason, completes_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 millisecond')
		-- the key is known (or a concurrent first call holds it; we wait for it): a repeat
		ON CONFLICT (idempotency_key) DO NOTHING`,
		c.key, c.policyID, c.bookingID, c.amount, c.description, outcome, reason, c.fault.CompletesIn().Milliseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// CountRepeat counts a repeat and returns what the key charged for.
func (c charge) CountRepeat(ctx context.Context, tx pgx.Tx) (fault.Subject, error) {
	var prev charge
	err := charges.CountRepeat(ctx, tx, c.key, "policy_id, booking_id", &prev.policyID, &prev.bookingID)
	if err != nil {
		return "", err
	}
	return prev.subject(), nil
}

// ApplyEffect writes the charge to the ledger. A slow charge's row is
// written at acceptance with applied_at in the future: durable at once,
// counted from its completion on.
func (c charge) ApplyEffect(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, booking_id, amount_cents, applied_at)
		VALUES ('charge', $1, $2, $3, $4, now() + $5 * interval '1 millisecond')`,
		c.key, c.policyID, c.bookingID, c.amount, c.fault.CompletesIn().Milliseconds())
	return err
}

// Notify queues the callbacks of the charge's outcome.
func (c charge) Notify(ctx context.Context, tx pgx.Tx) error {
	return webhooks.Notify(ctx, tx, charges, c.key)
}

// AcceptAgain: see fault.Table.AcceptAgain.
func (c charge) AcceptAgain(ctx context.Context, tx pgx.Tx) error {
	return charges.AcceptAgain(ctx, tx, c.key, c.fault.CompletesIn())
}

// receiveCharge processes one charge call in one transaction and returns the
// key's record afterwards.
func (p *Payments) receiveCharge(ctx context.Context, c charge) (fault.Record, error) {
	var rec chargeRecord
	err := pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := fault.Process(ctx, tx, c.fault, c.subject(), c); err != nil {
			return err
		}
		var err error
		rec, err = readCharge(ctx, tx, c.key)
		return err
	})
	if err != nil {
		return fault.Record{}, fmt.Errorf("fake payments: charge %s: %w", c.key, err)
	}
	return rec.record(), nil
}

// refund is one refund call: of a charge (chargeKey) or of a policy's
// premium paid elsewhere (policyID).
type refund struct {
	key       string
	chargeKey *string
	policyID  *int64
	amount    int64
	reason    string
	fault     fault.Call
	// refusal is the business reason to refuse a refund of a charge (none
	// such, not completed, more than remains); "" when it may go ahead.
	refusal string
	// of is the refunded charge's subject, copied to the ledger so a
	// subject's charges and refunds add up.
	ofPolicy, ofBooking *int64
}

var _ fault.Keyed = (*refund)(nil)

// reference is what the refund gives money back for: a repeat of the key
// must name the same.
func (r *refund) reference() fault.Subject {
	if r.chargeKey != nil {
		return fault.Subject("charge:" + *r.chargeKey)
	}
	return fault.Policy(*r.policyID)
}

// Accepted: the mode carries it out and the business rules allow it.
func (r *refund) Accepted() bool { return r.fault.Accepted() && r.refusal == "" }

func (r *refund) InsertFirst(ctx context.Context, tx pgx.Tx) (bool, error) {
	outcome, reason := "ACCEPTED", (*string)(nil)
	switch {
	case !r.fault.Accepted():
		outcome, reason = "REJECTED", new("the refund was refused (fault mode reject)")
	case r.refusal != "":
		outcome, reason = "REJECTED", &r.refusal
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO fake_payments.refunds (idempotency_key, charge_key, policy_id, amount_cents, reason,
		                                   outcome, reject_reason, completes_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8 * interval '1 millisecond')
		-- the key is known (or a concurrent first call holds it; we wait for it): a repeat
		ON CONFLICT (idempotency_key) DO NOTHING`,
		r.key, r.chargeKey, r.policyID, r.amount, r.reason, outcome, reason, r.fault.CompletesIn().Milliseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// CountRepeat counts a repeat and returns what the key refunded.
func (r *refund) CountRepeat(ctx context.Context, tx pgx.Tx) (fault.Subject, error) {
	prev := refund{}
	err := refunds.CountRepeat(ctx, tx, r.key, "charge_key, policy_id", &prev.chargeKey, &prev.policyID)
	if err != nil {
		return "", err
	}
	return prev.reference(), nil
}

// ApplyEffect writes the refund to the ledger: every applied refund is a
// row, so a double refund is there to see.
func (r *refund) ApplyEffect(ctx context.Context, tx pgx.Tx) error {
	policyID, bookingID := r.policyID, (*int64)(nil)
	if r.chargeKey != nil {
		policyID, bookingID = r.ofPolicy, r.ofBooking
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO fake_payments.ledger (kind, idempotency_key, policy_id, booking_id, charge_key, amount_cents, applied_at)
		VALUES ('refund', $1, $2, $3, $4, $5, now() + $6 * interval '1 millisecond')`,
		r.key, policyID, bookingID, r.chargeKey, r.amount, r.fault.CompletesIn().Milliseconds())
	return err
}

// Notify queues the callbacks of the refund's outcome.
func (r *refund) Notify(ctx context.Context, tx pgx.Tx) error {
	return webhooks.Notify(ctx, tx, refunds, r.key)
}

// AcceptAgain: see fault.Table.AcceptAgain.
func (r *refund) AcceptAgain(ctx context.Context, tx pgx.Tx) error {
	return refunds.AcceptAgain(ctx, tx, r.key, r.fault.CompletesIn())
}

// refundSubject is the subject faults are scoped by for r: its policy, or
// the subject of the charge it refunds ("" when that charge is unknown).
func (p *Payments) refundSubject(ctx context.Context, r refund) (fault.Subject, error) {
	if r.chargeKey == nil {
		return fault.Policy(*r.policyID), nil
	}
	var c charge
	err := p.Pool.QueryRow(ctx, `
		SELECT policy_id, booking_id
		  FROM fake_payments.charges
		 WHERE idempotency_key = $1`, *r.chargeKey).Scan(&c.policyID, &c.bookingID)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("fake payments: refund %s: %w", r.key, err)
	}
	return c.subject(), nil
}

// receiveRefund processes one refund call in one transaction. A refund of a
// charge first locks the charge and checks that it completed and that
// enough of it remains; refusing is a business answer (REJECTED), recorded
// like any other.
func (p *Payments) receiveRefund(ctx context.Context, r refund) (fault.Record, error) {
	var rec refundRecord
	err := pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if r.chargeKey != nil {
			if err := checkCharge(ctx, tx, &r); err != nil {
				return err
			}
		}
		if err := fault.Process(ctx, tx, r.fault, r.reference(), &r); err != nil {
			return err
		}
		var err error
		rec, err = readRefund(ctx, tx, r.key)
		return err
	})
	if err != nil {
		return fault.Record{}, fmt.Errorf("fake payments: refund %s: %w", r.key, err)
	}
	return rec.record(), nil
}

// checkCharge sets r.refusal when the charge r refunds cannot give r.amount
// back, and r.ofPolicy / r.ofBooking to the charge's subject.
func checkCharge(ctx context.Context, tx pgx.Tx, r *refund) error {
	var truth external.Truth
	var charged, refunded int64
	err := tx.QueryRow(ctx, `
		SELECT policy_id,
		       booking_id,
		       fault.truth(outcome, completes_at, statement_timestamp()),
		       amount_cents
		  FROM fake_payments.charges
		 WHERE idempotency_key = $1
		   -- refunds of one charge queue here, so two cannot both take what remains
		   FOR UPDATE`, *r.chargeKey).Scan(&r.ofPolicy, &r.ofBooking, &truth, &charged)
	if errors.Is(err, pgx.ErrNoRows) {
		r.refusal = fmt.Sprintf("there is no charge %s", *r.chargeKey)
		return nil
	}
	if err != nil {
		return err
	}
	// A statement of its own, after the lock: under READ COMMITTED it reads a
	// fresh snapshot, which includes the refunds committed by whoever held
	// the lock before us. (A subquery in the locking statement would read the
	// snapshot taken before the wait, and two refunds would both pass.)
	if err := tx.QueryRow(ctx, `
		SELECT coalesce(sum(amount_cents), 0)
		  FROM fake_payments.ledger
		 WHERE kind = 'refund'
		   AND charge_key = $1`, *r.chargeKey).Scan(&refunded); err != nil {
		return err
	}
	switch {
	case truth != external.TruthCompleted:
		r.refusal = fmt.Sprintf("charge %s is %s, not COMPLETED", *r.chargeKey, truth)
	case r.amount > charged-refunded:
		r.refusal = fmt.Sprintf("a refund of %d cents exceeds the %d cents that remain of charge %s", r.amount, charged-refunded, *r.chargeKey)
	}
	return nil
}

// chargeRecord is the service's record of a charge key, the JSON of its
// status answer.
type chargeRecord struct {
	Key         string         `json:"key"`
	Status      external.Truth `json:"status"`
	Reason      string         `json:"reason,omitempty"`
	PolicyID    *int64         `json:"policy_id,omitempty"`
	BookingID   *int64         `json:"booking_id,omitempty"`
	AmountCents int64          `json:"amount_cents"`
	Attempts    int            `json:"attempts"`
	ReceivedAt  time.Time      `json:"received_at"`
	CompletesAt time.Time      `json:"completes_at"`
	untilMS     float64
}

func (c chargeRecord) record() fault.Record {
	return fault.Record{Key: c.Key, Truth: c.Status, Reason: c.Reason, UntilComplete: until(c.Status, c.untilMS)}
}

// readCharge returns the record of a charge key; pgx.ErrNoRows means
// NOT_STARTED. The truth is read against statement_timestamp(), not now():
// a repeat that waited for the first call's commit started its transaction
// before that call's now(), and would see a completed key still RUNNING.
func readCharge(ctx context.Context, db database.DBTX, key string) (chargeRecord, error) {
	var c chargeRecord
	var reason *string
	err := db.QueryRow(ctx, `
		SELECT idempotency_key, fault.truth(outcome, completes_at, statement_timestamp()), reject_reason,
		       policy_id, booking_id, amount_cents, attempts, received_at, completes_at,
		       extract(epoch FROM greatest(completes_at - statement_timestamp(), interval '0')) * 1000
		  FROM fake_payments.charges
		 WHERE idempotency_key = $1`, key).
		Scan(&c.Key, &c.Status, &reason, &c.PolicyID, &c.BookingID, &c.AmountCents, &c.Attempts, &c.ReceivedAt, &c.CompletesAt, &c.untilMS)
	if reason != nil {
		c.Reason = *reason
	}
	return c, err
}

// refundRecord is the service's record of a refund key.
type refundRecord struct {
	Key         string         `json:"key"`
	Status      external.Truth `json:"status"`
	Reason      string         `json:"reason,omitempty"`
	ChargeKey   *string        `json:"charge_key,omitempty"`
	PolicyID    *int64         `json:"policy_id,omitempty"`
	AmountCents int64          `json:"amount_cents"`
	Attempts    int            `json:"attempts"`
	ReceivedAt  time.Time      `json:"received_at"`
	CompletesAt time.Time      `json:"completes_at"`
	untilMS     float64
}

func (r refundRecord) record() fault.Record {
	return fault.Record{Key: r.Key, Truth: r.Status, Reason: r.Reason, UntilComplete: until(r.Status, r.untilMS)}
}

func readRefund(ctx context.Context, db database.DBTX, key string) (refundRecord, error) {
	var r refundRecord
	var reason *string
	err := db.QueryRow(ctx, `
		SELECT idempotency_key, fault.truth(outcome, completes_at, statement_timestamp()), reject_reason,
		       charge_key, policy_id, amount_cents, attempts, received_at, completes_at,
		       extract(epoch FROM greatest(completes_at - statement_timestamp(), interval '0')) * 1000
		  FROM fake_payments.refunds
		 WHERE idempotency_key = $1`, key).
		Scan(&r.Key, &r.Status, &reason, &r.ChargeKey, &r.PolicyID, &r.AmountCents, &r.Attempts, &r.ReceivedAt, &r.CompletesAt, &r.untilMS)
	if reason != nil {
		r.Reason = *reason
	}
	return r, err
}

func until(t external.Truth, ms float64) time.Duration {
	if t != external.TruthRunning {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// ChargeTruth and RefundTruth return the service's truth for a key now.
func (p *Payments) ChargeTruth(ctx context.Context, key string) (external.Truth, error) {
	c, err := readCharge(ctx, p.Pool, key)
	return truthOf(c.Status, err)
}

func (p *Payments) RefundTruth(ctx context.Context, key string) (external.Truth, error) {
	r, err := readRefund(ctx, p.Pool, key)
	return truthOf(r.Status, err)
}

func truthOf(t external.Truth, err error) (external.Truth, error) {
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return external.TruthNotStarted, nil
	case err != nil:
		return "", fmt.Errorf("fake payments: truth: %w", err)
	}
	return t, nil
}
