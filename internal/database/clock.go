package database

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Clock is the one clock every lease and staleness comparison reads: the
// database's now(), never an application server's, so two instances whose
// clocks disagree still agree on who owns what. Tests move it instead of
// sleeping: a set Clock makes every such comparison read the time it holds.
//
// A query takes the clock as a parameter and compares with Now(n):
//
//	WHERE lease_expires_at < `+database.Now(1)+`
//	pool.Query(ctx, sql, clock.Arg())
//
// The zero Clock (and a nil *Clock) is the database's now().
type Clock struct {
	at atomic.Pointer[time.Time]
}

// Now is the SQL expression for "now" on the clock passed as parameter $n:
// the time a test set, else the database's now().
func Now(n int) string { return fmt.Sprintf("coalesce($%d::timestamptz, now())", n) }

// Arg is the value to pass for Now's parameter: nil (the database's now())
// unless a test set the clock.
func (c *Clock) Arg() *time.Time {
	if c == nil {
		return nil
	}
	return c.at.Load()
}

// Set makes the clock read t until Reset.
func (c *Clock) Set(t time.Time) { c.at.Store(&t) }

// Reset makes the clock the database's now() again.
func (c *Clock) Reset() { c.at.Store(nil) }
