package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config tunes a Loop. Zero fields take the defaults in withDefaults.
type Config struct {
	// Interval is the pause between passes (RECOVERY_INTERVAL, 1s).
	Interval time.Duration
	// BatchSize bounds the operations claimed per pass (RECOVERY_BATCH, 20).
	BatchSize int
	// Strategy is the claim strategy (RECOVERY_CLAIM, skip-locked).
	Strategy Strategy
	// Instance names this worker in timelines and logs (INSTANCE_ID).
	Instance string

	// The budget every recoverer gets; see Budget.
	Lease        time.Duration // OPERATION_LEASE, 30s
	MaxPolls     int           // RECOVERY_MAX_POLLS, 5; NoPolling for none
	PollInterval time.Duration // RECOVERY_POLL_INTERVAL, 500ms
	MaxAttempts  int           // RECOVERY_MAX_ATTEMPTS, 5
	Backoff      time.Duration // RECOVERY_BACKOFF, 1s
	MaxBackoff   time.Duration // 5m
	// RetryUnknown: the remote calls are idempotent (PROVIDER_IDEMPOTENT_CALLS).
	// A *bool so that the zero Config means true, the safe-to-study default.
	RetryUnknown *bool

	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are kept but not exported
}

// NoPolling as Config.MaxPolls: decide after the first status query.
const NoPolling = -1

func (cfg Config) withDefaults() Config {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 20
	}
	if cfg.Strategy == "" {
		cfg.Strategy = SkipLocked
	}
	if cfg.Instance == "" {
		cfg.Instance = "recovery"
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	switch {
	case cfg.MaxPolls == NoPolling:
		cfg.MaxPolls = 0
	case cfg.MaxPolls <= 0:
		cfg.MaxPolls = 5
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.RetryUnknown == nil {
		yes := true
		cfg.RetryUnknown = &yes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Budget is the budget the loop hands each recoverer.
func (cfg Config) Budget() Budget {
	cfg = cfg.withDefaults()
	return Budget{
		Lease: cfg.Lease, MaxPolls: cfg.MaxPolls, PollInterval: cfg.PollInterval,
		MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff,
		RetryUnknown: *cfg.RetryUnknown,
	}
}

// Loop is the recovery loop: every Interval it claims a bounded batch of
// stale operations and hands each to the Recoverer registered for its
// type. Several loops — in several processes — may run on one database;
// the claim makes sure each stale operation has one recoverer at a time.
type Loop struct {
	cfg        Config
	claimer    Claimer
	recoverers map[string]Recoverer
	metrics    *loopMetrics
	now        atomic.Pointer[time.Time] // tests move time; nil: the database clock
}

// New returns a loop claiming through claimer. Register recoverers before
// Run.
func New(claimer Claimer, cfg Config) *Loop {
	cfg = cfg.withDefaults()
	return &Loop{
		cfg:        cfg,
		claimer:    claimer,
		recoverers: map[string]Recoverer{},
		metrics:    newLoopMetrics(cfg.Registerer),
	}
}

// Register makes r the recoverer of operations of type opType.
func (l *Loop) Register(opType string, r Recoverer) { l.recoverers[opType] = r }

// Settings returns the loop's configuration, defaults applied.
func (l *Loop) Settings() Config { return l.cfg }

// Bound is about how long a stale operation waits before this loop
// finishes it, faults off: a pass comes within Interval, a claim made then
// polls at most MaxPollTime, plus one lease for the calls in between. (An
// owner that died still holds its lease first: add OPERATION_LEASE from the
// crash.) Backoffs add their waits per attempt.
func (l *Loop) Bound() time.Duration {
	b := l.cfg.Budget()
	return l.cfg.Interval + b.MaxPollTime() + b.Lease
}

// Actor is how this loop signs its timeline events.
func (l *Loop) Actor() string { return "recovery on " + l.cfg.Instance }

// Run makes a pass every Interval until ctx ends — at once after a pass
// that claimed a full batch, so a backlog drains at the speed of the work,
// not of the ticker. A failed pass is logged and the next one tries again. Work in flight when ctx ends is abandoned
// mid-way, which is safe: it was fenced, and its lease will lapse.
func (l *Loop) Run(ctx context.Context) {
	l.cfg.Logger.Info("recovery loop started", "strategy", l.cfg.Strategy, "interval", l.cfg.Interval,
		"batch", l.cfg.BatchSize, "budget", fmt.Sprintf("%+v", l.cfg.Budget()))
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		c, err := l.runOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			l.cfg.Logger.Error("recovery pass", "err", err)
		case c.Claimed > 0:
			l.cfg.Logger.Info("recovery pass", "claimed", c.Claimed, "succeeded", c.Succeeded, "failed", c.Failed,
				"reconcile", c.Reconcile, "backed_off", c.BackedOff, "fenced", c.Fenced, "errors", c.Errors, "polls", c.Polls)
		}
		if err == nil && c.Claimed == l.cfg.BatchSize {
			continue // a full batch: more are probably waiting, so drain now instead of at the next tick
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
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
	Errors    int // the recoverer failed (database trouble); the lease will lapse and another pass retries
	Polls     int
}

// runOnce is one pass: measure the lag, claim a batch, recover each claim
// concurrently (a slow one must not hold the others back), wait for all.
func (l *Loop) runOnce(ctx context.Context) (Counts, error) {
	now := l.now.Load()
	if age, err := l.claimer.StaleAge(ctx, now); err == nil {
		l.metrics.lag.Set(age.Seconds())
	}
	claims, err := l.claimer.ClaimStale(ctx, ClaimRequest{
		Strategy: l.cfg.Strategy, Actor: l.Actor(), Lease: l.cfg.Lease, Limit: l.cfg.BatchSize, Now: now,
	})
	if err != nil {
		return Counts{}, fmt.Errorf("recovery: claim: %w", err)
	}
	l.metrics.claims.WithLabelValues(string(l.cfg.Strategy)).Add(float64(len(claims)))

	var mu sync.Mutex
	counts := Counts{Claimed: len(claims)}
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := l.recover(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			counts.Polls += res.Polls
			l.metrics.polls.Add(float64(res.Polls))
			if err != nil {
				counts.Errors++
				if ctx.Err() == nil {
					l.cfg.Logger.Error("recover operation", "operation", c.ID, "type", c.Type, "err", err)
				}
				return
			}
			l.metrics.recovered.WithLabelValues(string(res.Outcome)).Inc()
			switch res.Outcome {
			case OutcomeSucceeded:
				counts.Succeeded++
			case OutcomeFailed:
				counts.Failed++
			case OutcomeReconcile:
				counts.Reconcile++
			case OutcomeBackedOff:
				counts.BackedOff++
			case OutcomeFenced:
				counts.Fenced++
			}
		}()
	}
	wg.Wait()
	return counts, nil
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
