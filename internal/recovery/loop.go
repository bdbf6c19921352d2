package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Loop is the recovery loop: every Interval it claims stale operations —
// at most BatchSize being recovered at once — and hands each to the
// Recoverer registered for its type. A pass does not wait for the
// recoveries it started: a slow one (polling a system that says RUNNING)
// never holds back the claim of an operation handed over a moment later.
// Several loops — in several processes — may run on one database; the
// claim makes sure each stale operation has one recoverer at a time.
type Loop struct {
	cfg        Config
	claimer    Claimer
	recoverers map[string]Recoverer
	metrics    *loopMetrics

	mu       sync.Mutex
	inFlight int // recoveries started and not finished
	// freed is signalled when a recovery finishes: its place is free, and
	// a loop that filled every place claims again then, not a tick later.
	freed chan struct{}
}

// New returns a loop claiming through claimer, configured by cfg (from
// LoadConfig or DefaultConfig; anything else panics). Register recoverers
// before Run.
func New(claimer Claimer, cfg Config) *Loop {
	if err := cfg.check(); err != nil {
		panic(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Loop{
		cfg:        cfg,
		claimer:    claimer,
		recoverers: map[string]Recoverer{},
		metrics:    newLoopMetrics(cfg.Registerer),
		freed:      make(chan struct{}, 1),
	}
}

// Register makes r the recoverer of operations of type opType.
func (l *Loop) Register(opType string, r Recoverer) { l.recoverers[opType] = r }

// Settings returns the loop's configuration.
func (l *Loop) Settings() Config { return l.cfg }

// Bounds are how long recovery takes to finish an operation once faults
// stop — computed here once; the recovery page, GET /api/v1/recovery,
// invariant 6 and docs/recovery.md quote these, not a formula of their own.
type Bounds struct {
	// Claimable: from the moment an operation can be claimed (its lease
	// ended or was handed over, no backoff in force) to finished — a pass
	// within Interval, polling at most MaxPollTime, and one Lease for the
	// status and step calls in between.
	Claimable time.Duration
	// AfterCrash: from a crash of its owner — the dead owner's Lease
	// first (nobody can tell a dead owner from a slow one sooner), then
	// Claimable.
	AfterCrash time.Duration
	// Backoff: the longest an operation backed off while a system was
	// away may still wait before it is claimable (RECOVERY_MAX_BACKOFF);
	// the bounds above start after it.
	Backoff time.Duration
}

// Bounds computes the bounds from cfg.
func (cfg Config) Bounds() Bounds {
	b := cfg.Budget()
	claimable := cfg.Interval + b.MaxPollTime() + b.Lease
	return Bounds{Claimable: claimable, AfterCrash: b.Lease + claimable, Backoff: b.MaxBackoff}
}

// Bounds are the loop's: Settings().Bounds().
func (l *Loop) Bounds() Bounds { return l.cfg.Bounds() }

// Bound is Bounds().Claimable.
func (l *Loop) Bound() time.Duration { return l.Bounds().Claimable }

// Actor is how this loop signs its timeline events.
func (l *Loop) Actor() string { return "recovery on " + l.cfg.Instance }

// Run makes a pass every Interval until ctx ends. After a pass that
// filled every free place (a backlog is probably waiting) the next pass
// comes as soon as a recovery finishes and frees a place, not at the next
// tick: a backlog drains at the speed of the work, not of the ticker (a
// loop whose places were all taken used to wait a whole Interval, which
// capped a drain at BatchSize operations a second per loop). A failed
// pass is logged and the next one tries again. When ctx ends, Run waits
// for the recoveries in flight to stop (their context is ctx): abandoning
// one mid-way is safe, it was fenced and its lease will lapse.
func (l *Loop) Run(ctx context.Context) {
	l.cfg.Logger.Info("recovery loop started", "strategy", l.cfg.Strategy, "interval", l.cfg.Interval,
		"batch", l.cfg.BatchSize, "budget", fmt.Sprintf("%+v", l.cfg.Budget()))
	var all sync.WaitGroup
	defer all.Wait()
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		p, err := l.pass(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			l.cfg.Logger.Error("recovery pass", "err", err)
		case len(p.claims) > 0:
			all.Add(1)
			go func() {
				defer all.Done()
				c := p.wait()
				l.cfg.Logger.Info("recovery pass", "claimed", c.Claimed, "succeeded", c.Succeeded, "failed", c.Failed,
					"reconcile", c.Reconcile, "backed_off", c.BackedOff, "fenced", c.Fenced, "reasked", c.Reasked,
					"errors", c.Errors, "polls", c.Polls)
			}()
		}
		// Every free place filled (or none was free): more are probably
		// waiting, so claim again once a place frees up.
		var freed <-chan struct{}
		if err == nil && len(p.claims) == max(p.limit, 0) {
			freed = l.freed
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-freed:
		}
	}
}

// Counts is what one pass did.
type Counts struct {
	Claimed   int
	Succeeded int
	Failed    int
	Reconcile int
	BackedOff int
	Fenced    int
	Reasked   int
	Errors    int // the recoverer failed (database trouble); the lease will lapse and another pass retries
	Polls     int
}

// RunOnce is one pass, waiting for the recoveries it started: how tests
// (and tools) step the loop.
func (l *Loop) RunOnce(ctx context.Context) (Counts, error) {
	p, err := l.pass(ctx)
	if err != nil {
		return Counts{}, err
	}
	return p.wait(), nil
}

// passRun is one pass's claims, recovering concurrently.
type passRun struct {
	limit  int
	claims []Claim
	wg     sync.WaitGroup
	mu     sync.Mutex
	counts Counts
}

func (p *passRun) wait() Counts {
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts
}

// pass measures the lag, claims as many operations as there are free
// places, and starts recovering each.
func (l *Loop) pass(ctx context.Context) (*passRun, error) {
	if age, err := l.claimer.StaleAge(ctx); err == nil {
		l.metrics.lag.Set(age.Seconds())
	}
	l.mu.Lock()
	p := &passRun{limit: l.cfg.BatchSize - l.inFlight}
	l.mu.Unlock()
	if p.limit <= 0 {
		return p, nil
	}
	claims, err := l.claimer.ClaimStale(ctx, ClaimRequest{
		Strategy: l.cfg.Strategy, Actor: l.Actor(), Lease: l.cfg.Lease, Limit: p.limit,
	})
	if err != nil {
		return p, fmt.Errorf("recovery: claim: %w", err)
	}
	l.metrics.claims.WithLabelValues(string(l.cfg.Strategy)).Add(float64(len(claims)))
	p.claims, p.counts.Claimed = claims, len(claims)
	l.mu.Lock()
	l.inFlight += len(claims)
	l.mu.Unlock()
	for _, c := range claims {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			res, err := l.recover(ctx, c)
			l.mu.Lock()
			l.inFlight--
			l.mu.Unlock()
			select {
			case l.freed <- struct{}{}:
			default: // a wake-up is pending already
			}
			p.count(l, c, res, err, ctx)
		}()
	}
	return p, nil
}

func (p *passRun) count(l *Loop, c Claim, res Result, err error, ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts.Polls += res.Polls
	l.metrics.polls.Add(float64(res.Polls))
	if err != nil {
		p.counts.Errors++
		if ctx.Err() == nil {
			l.cfg.Logger.Error("recover operation", "operation", c.ID, "type", c.Type, "err", err)
		}
		return
	}
	l.metrics.recovered.WithLabelValues(string(res.Outcome)).Inc()
	switch res.Outcome {
	case OutcomeSucceeded:
		p.counts.Succeeded++
	case OutcomeFailed:
		p.counts.Failed++
	case OutcomeReconcile:
		p.counts.Reconcile++
	case OutcomeBackedOff:
		p.counts.BackedOff++
	case OutcomeFenced:
		p.counts.Fenced++
	case OutcomeReasked:
		p.counts.Reasked++
	}
}

// errNoRecoverer: an operation type nobody registered. Its lease lapses
// again and it stays visible on the recovery page; a deploy that adds the
// recoverer picks it up.
var errNoRecoverer = errors.New("recovery: no recoverer registered for this operation type")

func (l *Loop) recover(ctx context.Context, c Claim) (Result, error) {
	r, ok := l.recoverers[c.Type]
	if !ok {
		return Result{}, fmt.Errorf("%w: %q", errNoRecoverer, c.Type)
	}
	return r.Recover(ctx, c, l.cfg.Budget())
}
