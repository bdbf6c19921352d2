package fault

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrKeyReused reports a key already used for another subject. A real
// system refuses that: one key names one request. Fakes answer it 409
// key_reused.
var ErrKeyReused = errors.New("fault: idempotency key reused for a different request")

// Keyed is one call as a fake's own state sees it: the SQL that records
// the key, counts a repeat and applies the effect, on the fake's own tables.
// Process runs them in the order the idempotency switch dictates.
type Keyed interface {
	// Accepted reports whether the call is to take effect: its mode accepts
	// it (ok, lost_response, slow) and the fake's business rules allow it.
	Accepted() bool
	// InsertFirst records the first call with the key and reports whether
	// this call was it (INSERT … ON CONFLICT DO NOTHING: a concurrent first
	// call makes it wait, then report false).
	InsertFirst(ctx context.Context, tx pgx.Tx) (first bool, err error)
	// CountRepeat counts a repeat and returns the subject the key belongs to.
	CountRepeat(ctx context.Context, tx pgx.Tx) (Subject, error)
	// ApplyEffect writes one row to the fake's ledger: the effect itself.
	ApplyEffect(ctx context.Context, tx pgx.Tx) error
	// AcceptAgain updates the key's record after a repeat on a fake that is
	// not idempotent was accepted: an acceptance overrides an earlier
	// refusal, and the earliest completion stands.
	AcceptAgain(ctx context.Context, tx pgx.Tx) error
	// Notify queues the callbacks of the key's outcome as now recorded
	// (Outbox.Notify), in the transaction that recorded it.
	Notify(ctx context.Context, tx pgx.Tx) error
}

// Process carries out one call of subject in the fake's transaction tx.
// This is where the idempotency switch lives, once for every fake:
//
//   - The first call with a key records it and, if accepted, applies the
//     effect, in the same commit — with the callbacks of its outcome queued.
//   - A repeat on an idempotent fake only counts the attempt: no effect, and
//     the key's record (the first outcome) is what it answers.
//   - A repeat on a fake that is not idempotent is processed again: a second
//     effect, which is the double cancellation (or refund) a caller must
//     avoid.
//
// Two concurrent first calls with one key cannot both record it: the
// primary key makes the second INSERT … ON CONFLICT wait for the first to
// commit, then it finds the row and takes the repeat path. So an idempotent
// fake applies one effect however many copies race, with no lock of its own.
// A repeat for another subject returns ErrKeyReused; the caller must roll
// back (the attempt count too).
func Process(ctx context.Context, tx pgx.Tx, call Call, subject Subject, k Keyed) error {
	first, err := k.InsertFirst(ctx, tx)
	if err != nil {
		return err
	}
	if first {
		if k.Accepted() {
			if err := k.ApplyEffect(ctx, tx); err != nil {
				return err
			}
		}
		return k.Notify(ctx, tx)
	}
	owner, err := k.CountRepeat(ctx, tx)
	if err != nil {
		return err
	}
	if owner != subject {
		return ErrKeyReused
	}
	if call.Idempotent || !k.Accepted() {
		return nil
	}
	if err := k.ApplyEffect(ctx, tx); err != nil {
		return err
	}
	if err := k.AcceptAgain(ctx, tx); err != nil {
		return err
	}
	return k.Notify(ctx, tx)
}
