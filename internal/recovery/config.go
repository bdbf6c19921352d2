package recovery

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config tunes a Loop and the Budget it hands each recoverer. It comes from
// LoadConfig (the environment) or DefaultConfig (the same with nothing
// set): the defaults and the validation live there, and nowhere else.
type Config struct {
	Interval  time.Duration // RECOVERY_INTERVAL, 1s: the pause between passes
	BatchSize int           // RECOVERY_BATCH, 20: operations recovered at once, at most
	Strategy  Strategy      // RECOVERY_CLAIM, skip-locked
	Instance  string        // INSTANCE_ID: names this worker in timelines and logs

	// The budget; see Budget.
	Lease         time.Duration // OPERATION_LEASE, 30s
	MaxPolls      int           // RECOVERY_MAX_POLLS, 5 (0: decide after the first status query)
	PollInterval  time.Duration // RECOVERY_POLL_INTERVAL, 500ms
	MaxAttempts   int           // RECOVERY_MAX_ATTEMPTS, 5
	Backoff       time.Duration // RECOVERY_BACKOFF, 1s
	MaxBackoff    time.Duration // RECOVERY_MAX_BACKOFF, 5m
	ClockSkew     time.Duration // RECOVERY_CLOCK_SKEW, 1s (0 allowed)
	ReaskInterval time.Duration // RECOVERY_REASK_INTERVAL, 30s

	Logger     *slog.Logger          // nil: slog.Default()
	Registerer prometheus.Registerer // nil: metrics are kept but not exported
}

// LoadConfig reads the RECOVERY_* environment (docs/api.md lists it), with
// OPERATION_LEASE and INSTANCE_ID. An unset variable takes its default; a
// set one must be valid.
func LoadConfig(getenv func(string) string) (Config, error) {
	var cfg Config
	var errs []error
	duration := func(name, def string, allowZero bool) time.Duration {
		v := cmp.Or(getenv(name), def)
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || (d == 0 && !allowZero) {
			errs = append(errs, fmt.Errorf("%s: %q is not a positive duration such as %s", name, v, def))
		}
		return d
	}
	whole := func(name, def string, low, high int) int {
		v := cmp.Or(getenv(name), def)
		n, err := strconv.Atoi(v)
		if err != nil || n < low || n > high {
			errs = append(errs, fmt.Errorf("%s: %q is not a whole number from %d to %d", name, v, low, high))
		}
		return n
	}
	cfg.Interval = duration("RECOVERY_INTERVAL", "1s", false)
	cfg.BatchSize = whole("RECOVERY_BATCH", "20", 1, 1000)
	strategy, err := ParseStrategy(cmp.Or(getenv("RECOVERY_CLAIM"), string(SkipLocked)))
	errs = append(errs, err)
	cfg.Strategy = strategy
	cfg.Instance = cmp.Or(getenv("INSTANCE_ID"), "recovery")
	cfg.Lease = duration("OPERATION_LEASE", "30s", false)
	cfg.MaxPolls = whole("RECOVERY_MAX_POLLS", "5", 0, 30)
	cfg.PollInterval = duration("RECOVERY_POLL_INTERVAL", "500ms", false)
	cfg.MaxAttempts = whole("RECOVERY_MAX_ATTEMPTS", "5", 1, 100)
	cfg.Backoff = duration("RECOVERY_BACKOFF", "1s", false)
	cfg.MaxBackoff = duration("RECOVERY_MAX_BACKOFF", "5m", false)
	cfg.ClockSkew = duration("RECOVERY_CLOCK_SKEW", "1s", true)
	cfg.ReaskInterval = duration("RECOVERY_REASK_INTERVAL", "30s", false)
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// DefaultConfig is LoadConfig with nothing set. Tests start from it and
// change what they study.
func DefaultConfig() Config {
	cfg, err := LoadConfig(func(string) string { return "" })
	if err != nil {
		panic(err) // the defaults above are valid
	}
	return cfg
}

// Budget is the budget the loop hands each recoverer.
func (cfg Config) Budget() Budget {
	return Budget{
		Lease: cfg.Lease, MaxPolls: cfg.MaxPolls, PollInterval: cfg.PollInterval,
		MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff,
		ClockSkew: cfg.ClockSkew, ReaskInterval: cfg.ReaskInterval,
	}
}

// check reports a Config that did not come from LoadConfig whole: a zero
// where a duration or a count is needed.
func (cfg Config) check() error {
	if cfg.Interval <= 0 || cfg.BatchSize <= 0 || cfg.Lease <= 0 || cfg.PollInterval <= 0 || cfg.MaxAttempts <= 0 ||
		cfg.Backoff <= 0 || cfg.MaxBackoff <= 0 || cfg.ReaskInterval <= 0 || cfg.MaxPolls < 0 || cfg.ClockSkew < 0 {
		return fmt.Errorf("recovery: incomplete config %+v: start from DefaultConfig or LoadConfig", cfg)
	}
	_, err := ParseStrategy(string(cfg.Strategy))
	return err
}
