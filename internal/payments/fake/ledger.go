package fake

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/fault"
)

// Ledger is the payments service's account of every money movement it
// carried out, the JSON of GET /v1/ledger. An idempotent service has at most
// one movement per key; with the switch off a repeat adds another, and a
// subject's line shows the double refund.
type Ledger struct {
	Charges Totals `json:"charges"`
	Refunds Totals `json:"refunds"`
	// BySubject sums the movements per policy or booking.
	BySubject []SubjectLine `json:"by_subject"`
	// Entries are the latest movements, newest first (at most 200).
	Entries []Entry `json:"entries"`
	// Late lists the calls refused for arriving after their deadline.
	Late fault.LateArrivals `json:"late"`
}

// Totals count one kind of movement: those that have taken hold, and those
// of slow calls accepted but not yet complete.
type Totals struct {
	Count       int64 `json:"count"`
	Pending     int64 `json:"pending"`
	AmountCents int64 `json:"amount_cents"`
}

// SubjectLine is one policy's or booking's movements. Refunds above 1 for a
// policy is a double refund.
type SubjectLine struct {
	PolicyID      *int64 `json:"policy_id,omitempty"`
	BookingID     *int64 `json:"booking_id,omitempty"`
	Charges       int64  `json:"charges"`
	Refunds       int64  `json:"refunds"`
	Pending       int64  `json:"pending"`
	ChargedCents  int64  `json:"charged_cents"`
	RefundedCents int64  `json:"refunded_cents"`
}

// Entry is one movement.
type Entry struct {
	ID          int64     `json:"id"`
	Kind        string    `json:"kind"` // charge or refund
	Key         string    `json:"key"`
	PolicyID    *int64    `json:"policy_id,omitempty"`
	BookingID   *int64    `json:"booking_id,omitempty"`
	ChargeKey   *string   `json:"charge_key,omitempty"`
	AmountCents int64     `json:"amount_cents"`
	AppliedAt   time.Time `json:"applied_at"`
	Pending     bool      `json:"pending"`
}

// Ledger reads the ledger now, by the database clock, in one snapshot.
func (p *Payments) Ledger(ctx context.Context) (Ledger, error) {
	l := Ledger{BySubject: []SubjectLine{}, Entries: []Entry{}}
	err := pgx.BeginTxFunc(ctx, p.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT kind,
			       count(*) FILTER (WHERE applied_at <= now()),
			       count(*) FILTER (WHERE applied_at > now()),
			       coalesce(sum(amount_cents) FILTER (WHERE applied_at <= now()), 0)
			  FROM fake_payments.ledger
			 GROUP BY kind`)
		if err != nil {
			return err
		}
		var kind string
		var t Totals
		if _, err := pgx.ForEachRow(rows, []any{&kind, &t.Count, &t.Pending, &t.AmountCents}, func() error {
			if kind == "charge" {
				l.Charges = t
			} else {
				l.Refunds = t
			}
			return nil
		}); err != nil {
			return err
		}

		rows, err = tx.Query(ctx, `
			SELECT policy_id,
			       booking_id,
			       count(*) FILTER (WHERE kind = 'charge' AND applied_at <= now()),
			       count(*) FILTER (WHERE kind = 'refund' AND applied_at <= now()),
			       count(*) FILTER (WHERE applied_at > now()),
			       coalesce(sum(amount_cents) FILTER (WHERE kind = 'charge' AND applied_at <= now()), 0),
			       coalesce(sum(amount_cents) FILTER (WHERE kind = 'refund' AND applied_at <= now()), 0)
			  FROM fake_payments.ledger
			 GROUP BY policy_id, booking_id
			 ORDER BY policy_id NULLS LAST, booking_id`)
		if err != nil {
			return err
		}
		if l.BySubject, err = pgx.CollectRows(rows, pgx.RowToStructByPos[SubjectLine]); err != nil {
			return err
		}

		rows, err = tx.Query(ctx, `
			SELECT id, kind, idempotency_key, policy_id, booking_id, charge_key, amount_cents, applied_at,
			       applied_at > now()
			  FROM fake_payments.ledger
			 ORDER BY id DESC
			 LIMIT 200`)
		if err != nil {
			return err
		}
		if l.Entries, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Entry]); err != nil {
			return err
		}
		l.Late, err = p.Store.Late(ctx, tx)
		return err
	})
	if err != nil {
		return Ledger{}, fmt.Errorf("fake payments: ledger: %w", err)
	}
	return l, nil
}
