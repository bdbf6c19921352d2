package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Attempt is one request the middleware let through to execute: its key is
// valid, its fingerprint taken, and the store had no answer for it. The key
// is not claimed yet: the workflow claims it with Claim inside its first
// transaction, so that the claim commits together with the request's first
// business writes — or, when the work stays in PostgreSQL, with everything.
type Attempt struct {
	UserID      int64
	Key         string
	fingerprint []byte
	store       *Store

	// claim is set once Claim succeeded, for the middleware's cleanup. Only
	// the request's goroutine touches it.
	claim *Claim
}

// Claim makes the caller the key's owner, on tx: the whole decision of who
// executes, in one place.
//
//   - INSERT … ON CONFLICT DO NOTHING: a new key is ours. A concurrent
//     duplicate still inside its first transaction makes this wait (bounded)
//     until that transaction ends.
//   - Nothing inserted: the key exists. TakeOver makes it ours only if its
//     owner looks dead (lease expired) and it is the same request.
//   - Neither: ErrAlreadyClaimed — someone else completed it or holds it.
//     The workflow returns the error, its transaction rolls back, and the
//     middleware answers from the store.
//
// A nil *Attempt (a workflow run without the middleware) claims nothing and
// returns (nil, nil).
func (a *Attempt) Claim(ctx context.Context, tx pgx.Tx) (*Claim, error) {
	if a == nil {
		return nil, nil
	}
	c, err := a.store.Claim(ctx, tx, a.UserID, a.Key, a.fingerprint)
	if err == nil && c == nil {
		c, err = a.store.TakeOver(ctx, tx, a.UserID, a.Key, a.fingerprint)
	}
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, ErrAlreadyClaimed
	}
	a.claim = c
	return c, nil
}

type attemptKey struct{}

// AttemptFrom returns the attempt the middleware put in ctx, or nil on a
// route without the middleware (a nil *Attempt claims nothing).
func AttemptFrom(ctx context.Context) *Attempt {
	a, _ := ctx.Value(attemptKey{}).(*Attempt)
	return a
}

// KeyOrEmpty is the attempt's key, or "" for a nil attempt. Workflows keep
// the request's key on what it started (an operation remembers the key that
// asked for it, so a retry of that very request is recognised).
func (a *Attempt) KeyOrEmpty() string {
	if a == nil {
		return ""
	}
	return a.Key
}
