package workflow

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// A transaction's memo: what one step read, kept for the steps after it in
// the same transaction. The cancellation reads what it refunds with the
// UPDATE that cancels the policy, and the event and the refund's request
// that follow in that transaction use it instead of reading it again: a
// round trip saved, with the connection held, for every cancellation. A
// step in another transaction (a resumed run, a person's decision) finds
// nothing and reads for itself, so the memo never decides anything.

type memo struct {
	tx     pgx.Tx // the transaction it belongs to
	values map[any]any
}

type memoKey struct{}

// Remember keeps v under key for the rest of tx. Outside a step (no memo
// in ctx) it keeps nothing.
func Remember[T any](ctx context.Context, tx pgx.Tx, key any, v T) {
	if m, ok := ctx.Value(memoKey{}).(*memo); ok && m.tx == tx {
		m.values[key] = v
	}
}

// Recall returns what a step of tx remembered under key.
func Recall[T any](ctx context.Context, tx pgx.Tx, key any) (T, bool) {
	if m, ok := ctx.Value(memoKey{}).(*memo); ok && m.tx == tx {
		v, ok := m.values[key].(T)
		return v, ok
	}
	var zero T
	return zero, false
}

// stepCtx is ctx for a step run in tx: with tx's memo, a new one when the
// runner's belongs to an earlier transaction. (The memo holds tx, so no
// later transaction can be allocated where it was and pass for it.)
func (r *runner) stepCtx(ctx context.Context, tx pgx.Tx) context.Context {
	if r.memo == nil || r.memo.tx != tx {
		r.memo = &memo{tx: tx, values: map[any]any{}}
	}
	return context.WithValue(ctx, memoKey{}, r.memo)
}
