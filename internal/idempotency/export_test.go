package idempotency

import (
	"context"
	"time"
)

// Hooks for the external tests (package idempotency_test) into unexported state.

// SetNow makes every query of s use t instead of the database's now(); the
// zero time restores the database clock.
func (s *Store) SetNow(t time.Time) {
	if t.IsZero() {
		s.clock.Reset()
		return
	}
	s.clock.Set(t)
}

// RunOnce is runOnce.
func (j *Janitor) RunOnce(ctx context.Context) (int, error) { return j.runOnce(ctx) }

// SetClaimWait changes how long a claim waits for a concurrent duplicate's
// open transaction.
func (s *Store) SetClaimWait(d time.Duration) { s.claimWait = d }
