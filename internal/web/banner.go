package web

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/invariants"
)

// brokenCacheFor is how long one check of every invariant answers the
// admin pages' banner while nothing was committed since. A check reads
// every table the invariants cover (a few milliseconds on the demo data,
// ~200 ms at 100k rows, BenchmarkCheck100k): on an idle database once per
// interval, not once per page. Any commit since the check (the snapshot
// moved) makes the next page check again, so a write that breaks an
// invariant shows on the next page load (third read, finding 7: the banner
// lagged GET /api/v1/invariants by seconds). The interval still bounds the
// invariants that break with time alone (6, 9).
const brokenCacheFor = 5 * time.Second

// brokenInvariants caches the last invariants.Check for the banner every
// admin page shows while an invariant is broken (layout.templ).
type brokenInvariants struct {
	mu      sync.Mutex // held during a check: one runs at a time, the others wait for it
	checked time.Time
	seen    string // the database snapshot (pg_current_snapshot) read just before the check
	broken  []invariants.Violation
}

// sqlSnapshot names what has committed: it changes with every commit on
// the server (a new transaction id, or one no longer in progress), so an
// unchanged snapshot means the data the last check read is the data now.
const sqlSnapshot = `SELECT pg_current_snapshot()::text`

// staleAfter is invariant 6's default bound, shared by GET /api/v1/invariants
// and the banner: recovery's bound from claimable (recovery.Bounds) plus
// staleMargin.
func (app *App) staleAfter() time.Duration { return app.recovery.Bound() + staleMargin }

// staleMargin is invariant 6's allowance beyond recovery's bound from the
// moment an operation is claimable (recovery.Bounds): a busy machine's
// slack, so the banner never turns red on a slow pass.
const staleMargin = time.Minute

// brokenNow returns what is broken, in words, from a check at most
// brokenCacheFor old. A check that fails (the database is away) keeps the
// last answer: the banner is a warning, never a reason for a page to fail.
// Events not delivered yet are not called broken while this process's
// broker does not answer: brokerAway says that instead.
func (app *App) brokenNow(ctx context.Context) []string {
	away := app.broker.Status().Away
	var lines []string
	for _, v := range app.violationsNow(ctx) {
		if v.Undelivered && away {
			continue // the outbox keeps them until the broker answers (brokerAway)
		}
		lines = append(lines, describeViolation(v))
	}
	return lines
}

func (app *App) violationsNow(ctx context.Context) []invariants.Violation {
	b := &app.broken
	b.mu.Lock()
	defer b.mu.Unlock()
	checkCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var seen string
	if err := app.pool.QueryRow(checkCtx, sqlSnapshot).Scan(&seen); err != nil {
		seen = "" // unknown: check (a failed check keeps the last answer)
	}
	if !b.checked.IsZero() && seen != "" && seen == b.seen && time.Since(b.checked) < brokenCacheFor {
		return b.broken // nothing committed since the last check
	}
	r, err := invariants.Check(checkCtx, app.pool, invariants.Options{StaleAfter: app.staleAfter(), MaxIDs: 5, Retention: app.cfg.OperationsRetention})
	if err != nil && ctx.Err() != nil {
		return b.broken // the page's client left: no check failed, the next page checks
	}
	b.checked = time.Now()
	if err != nil {
		logFrom(ctx).Warn("invariants banner: check failed", "err", err)
		return b.broken
	}
	b.broken, b.seen = r.Violations, seen
	return b.broken
}

// brokerGrace is how long a broker may be away before the pages say so: a
// process that has just started reaches it within it.
const brokerGrace = 5 * time.Second

// brokerAway says, while this process's broker does not answer, what that
// means: the cause, and that the outbox keeps every event ("" while it
// answers).
//
// The cause is in words (events.BrokerCause), never the client's error
// text. A process that runs no relay (EVENTS_WORKERS=off) cannot tell
// whether the one that does runs: it says so, and only while events wait.
func (app *App) brokerAway(ctx context.Context) string {
	st := app.broker.Status()
	if !st.Away || time.Since(st.Since) < brokerGrace {
		return ""
	}
	if st.Elsewhere {
		if !slices.ContainsFunc(app.violationsNow(ctx), func(v invariants.Violation) bool { return v.Undelivered }) {
			return ""
		}
		return "This process runs no relay (EVENTS_WORKERS=off): another process, web events, delivers the events, " +
			"and events written long ago are not delivered yet — that process may not be running, or its broker may not " +
			"answer; this one cannot tell. The outbox keeps every event: none is lost, and each is delivered once a " +
			"relay runs. Until then customers' mailboxes and the ledger wait."
	}
	return fmt.Sprintf("%s does not answer at %s (since %s: %s). The outbox keeps every event: none is lost, "+
		"and the relay sends each one once %s answers. Until then customers' mailboxes and the ledger wait, "+
		"and events not delivered are not a broken invariant.",
		st.Name, st.Addr, st.Since.UTC().Format("15:04:05 MST"), st.Why, st.Name)
}

// forget drops the cached check, so the next page checks again (after a
// demo reset, which starts clean).
func (b *brokenInvariants) forget() {
	b.mu.Lock()
	b.checked = time.Time{}
	b.mu.Unlock()
}

// describeViolation is one line of the banner: "Invariant 1: at most one
// provider cancellation effect per policy — policy 7".
func describeViolation(v invariants.Violation) string {
	var rows []string
	for _, id := range v.IDs {
		rows = append(rows, fmt.Sprint(id))
	}
	rows = append(rows, v.Keys...)
	s := fmt.Sprintf("Invariant %d: %s", v.Invariant, v.Detail)
	if len(rows) > 0 {
		s += " — ids " + strings.Join(rows, ", ")
	}
	return s
}
