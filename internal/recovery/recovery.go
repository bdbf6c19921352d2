package recovery

import (
	"context"
	"fmt"
	"time"
)

// Strategy is how a worker claims stale operations when several workers
// scan the same table. Both end the same way — the claimer is the owner, with
// a new owner token and a new lease — and differ in how they keep two
// workers off one row. See doc.go and docs/recovery.md.
type Strategy string

const (
	// SkipLocked selects a batch of stale rows with FOR UPDATE SKIP LOCKED
	// and makes the transition in the same transaction: rows another
	// worker is claiming right now are skipped, never waited for.
	SkipLocked Strategy = "skip-locked"
	// Transition reads candidates without locking, then claims each with
	// one conditional UPDATE … WHERE <still stale> RETURNING: one row
	// returned is mine, zero rows means someone else got there first.
	Transition Strategy = "transition"
)

// ParseStrategy reads RECOVERY_CLAIM.
func ParseStrategy(s string) (Strategy, error) {
	switch Strategy(s) {
	case SkipLocked, Transition:
		return Strategy(s), nil
	}
	return "", fmt.Errorf("recovery: claim strategy %q (want skip-locked or transition)", s)
}

// ClaimRequest asks a Claimer for up to Limit stale operations.
type ClaimRequest struct {
	Strategy Strategy
	// Actor names the claimer in the timeline: "recovery on app-2".
	Actor string
	// Lease is how long the claimer owns each claimed operation before
	// another worker may take it (it renews while it works).
	Lease time.Duration
	Limit int
}

// Claim is one operation this worker now owns.
type Claim struct {
	ID   int64
	Type string // selects the Recoverer
	// Token is the claimer's owner token: every later write carries
	// AND owner_token = Token, so a worker whose lease lapsed writes nothing.
	Token string
	// From is the status the operation was claimed from.
	From string
	// Reason says why it was claimable, for the timeline and the logs:
	// handed over on purpose, its backoff over, its owner's lease run out,
	// due to be asked again while waiting for a person.
	Reason string
	Actor  string
	// SeenUpdatedAt is the operation's updated_at when claimed. A claim of
	// an operation waiting for a person takes no ownership (Token is
	// empty): acting on it is conditional on this being unchanged.
	SeenUpdatedAt time.Time
	// Seen is the operation as the claim read it, for the Recoverer of its
	// type, so recovering it starts without reading it again (nil: the
	// recoverer reads it). It is as current as a read after the claim: the
	// claim replaced the owner token first, so every later write of an
	// earlier owner is fenced.
	Seen any
}

// Claimer finds and claims the stale operations of every workflow. It
// lives with the operations table's SQL (workflow.Engine); this package
// stays free of any table.
type Claimer interface {
	// ClaimStale claims up to req.Limit operations that are IN_PROGRESS or
	// RECOVERING, whose lease has expired and whose next attempt is due,
	// recording a timeline event for each claim in the same transaction;
	// then, within the limit, operations waiting for a person that are due
	// to be asked again.
	ClaimStale(ctx context.Context, req ClaimRequest) ([]Claim, error)
	// StaleAge is how long the oldest claimable operation has been
	// claimable (0 when none is): the recovery lag.
	StaleAge(ctx context.Context) (time.Duration, error)
}

// Recoverer finishes one claimed operation of its type by finding out what
// really happened and acting on it. Every write it makes must be fenced by
// c.Token; ErrLeaseLost-style failures are reported as OutcomeFenced.
type Recoverer interface {
	Recover(ctx context.Context, c Claim, b Budget) (Result, error)
}

// Outcome is how one recovery attempt ended.
type Outcome string

const (
	OutcomeSucceeded Outcome = "succeeded"            // finished: the work took effect
	OutcomeFailed    Outcome = "failed"               // finished: the remote side refused
	OutcomeReconcile Outcome = "needs_reconciliation" // a person must decide
	OutcomeBackedOff Outcome = "backed_off"           // unknown still: tried again after a backoff
	OutcomeFenced    Outcome = "fenced"               // lease lost mid-way: another worker owns it; nothing written
	OutcomeReasked   Outcome = "reasked"              // waiting for a person, asked again: still not known
)

// Outcomes lists them, for metrics and pages.
var Outcomes = []Outcome{OutcomeSucceeded, OutcomeFailed, OutcomeReconcile, OutcomeBackedOff, OutcomeFenced, OutcomeReasked}

// Result is what a Recoverer reports about one claim.
type Result struct {
	Outcome Outcome
	// Branch is the decision-tree branch taken ("completed",
	// "not_started", "poll", …), as recorded on the operation's timeline.
	Branch string
	// Polls counts the status queries made while polling.
	Polls int
}

// Budget bounds what a recoverer may do with one claim. The loop passes the
// same budget to every recoverer, from its Config. What the app believes
// about each system's idempotency is not here: it is one setting per system
// in the database, read at the moment of each decision (Belief, belief.go).
type Budget struct {
	// Lease is the claimer's lease; renewed (fenced) before every wait.
	Lease time.Duration
	// MaxPolls bounds the status queries made while the remote side is
	// RUNNING or cannot be asked; PollInterval is the first wait between
	// them, doubling after each.
	MaxPolls     int
	PollInterval time.Duration
	// MaxAttempts bounds recovery attempts (the request's own counts);
	// once they are used, the next status query that cannot settle the
	// outcome hands the operation to a person. Backoff is the wait after
	// the first attempt, doubling up to MaxBackoff.
	MaxAttempts int
	Backoff     time.Duration
	MaxBackoff  time.Duration
	// ClockSkew is the margin by which clocks may disagree: NOT_STARTED is
	// conclusive only once every earlier attempt's deadline plus ClockSkew
	// has passed on the database clock.
	ClockSkew time.Duration
	// ReaskInterval is how long an operation waiting for a person waits
	// before its system is asked again, doubling up to MaxBackoff.
	ReaskInterval time.Duration
}

// PollWait is the wait before poll n (1-based): PollInterval, doubling.
func (b Budget) PollWait(n int) time.Duration {
	return doubling(b.PollInterval, n-1, 0)
}

// MaxPollTime is the longest a recoverer spends polling one claim.
func (b Budget) MaxPollTime() time.Duration {
	var total time.Duration
	for n := 1; n <= b.MaxPolls; n++ {
		total += b.PollWait(n)
	}
	return total
}

// BackoffAfter is how long to wait before the next attempt once attempts
// have been made: Backoff, doubling, at most MaxBackoff.
func (b Budget) BackoffAfter(attempts int) time.Duration {
	return doubling(b.Backoff, attempts-1, b.MaxBackoff)
}

// ReaskAfter is the wait before the n-th question (1-based) to an
// operation waiting for a person: ReaskInterval, doubling, at most
// MaxBackoff (or ReaskInterval when that is larger).
func (b Budget) ReaskAfter(n int) time.Duration {
	return doubling(b.ReaskInterval, n-1, b.ReaskMax())
}

// ReaskMax is the longest wait between two questions to an operation
// waiting for a person: MaxBackoff, or ReaskInterval when that is larger.
func (b Budget) ReaskMax() time.Duration {
	return max(b.MaxBackoff, b.ReaskInterval)
}

// ReaskAfterWaiting is the wait before the next question to an operation
// that has waited for a person for waited: as long again — so the
// questions come at the re-ask interval, doubling from when it began to
// wait — at least ReaskInterval, at most MaxBackoff (or ReaskInterval when
// that is larger).
func (b Budget) ReaskAfterWaiting(waited time.Duration) time.Duration {
	return min(max(waited, b.ReaskInterval), b.ReaskMax())
}

func doubling(base time.Duration, times int, limit time.Duration) time.Duration {
	d := base
	for i := 0; i < times && (limit <= 0 || d < limit) && d < time.Hour; i++ {
		d *= 2
	}
	if limit > 0 && d > limit {
		d = limit
	}
	return d
}
