package workflow

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// Hooks connect a workflow's transactions to the request that runs it,
// without the workflow knowing anything about HTTP. The workflow opens every
// transaction; the hooks run inside them:
//
//   - Begin runs first in the workflow's first transaction. The web layer
//     claims the request's Idempotency-Key there, so a crash before the first
//     commit leaves nothing behind and a concurrent duplicate waits for this
//     transaction. An error rolls the transaction back and ends the workflow.
//   - Finish runs in the transaction that decides the request's answer, with
//     the result or the business refusal (a slot already taken, a duplicate
//     intent, an unknown id). The web layer stores the answer there, so the
//     outcome and the answer a retry will replay commit together.
//
// Work that stays in PostgreSQL runs Begin, its writes and Finish in one
// transaction: one commit. Work that calls another system commits Begin with
// the intent, makes the call outside any transaction, and commits the outcome
// with Finish. Either hook may be nil (the recovery loop, tests).
type Hooks[T any] struct {
	Begin  func(ctx context.Context, tx pgx.Tx) error
	Finish func(ctx context.Context, tx pgx.Tx, result T, refusal error) error
}

// RunBegin calls h.Begin when it is set.
func (h Hooks[T]) RunBegin(ctx context.Context, tx pgx.Tx) error {
	if h.Begin == nil {
		return nil
	}
	return h.Begin(ctx, tx)
}

// RunFinish calls h.Finish when it is set.
func (h Hooks[T]) RunFinish(ctx context.Context, tx pgx.Tx, result T, refusal error) error {
	if h.Finish == nil {
		return nil
	}
	return h.Finish(ctx, tx, result, refusal)
}

// Refused marks err as a business refusal — "the slot is taken", "the policy
// already has a cancellation" — that the workflow passed to Finish and
// committed. A workflow returns its refusals this way, so its caller can tell
// an answer that is stored (send it) from a failure after which nothing was
// committed. errors.Is and errors.As see through it to err.
func Refused(err error) error {
	if err == nil {
		return nil
	}
	return &refusal{err: err}
}

// IsRefused reports whether err is (or wraps) a refusal made by Refused.
func IsRefused(err error) bool {
	var r *refusal
	return errors.As(err, &r)
}

type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }
