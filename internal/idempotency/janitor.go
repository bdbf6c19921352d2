package idempotency

import (
	"context"
	"log/slog"
	"time"
)

// JanitorConfig configures a Janitor. Zero fields take the defaults.
type JanitorConfig struct {
	// Interval between runs. Default 1 minute.
	Interval time.Duration
	// BatchSize is how many keys one DELETE removes: small enough that no
	// statement holds many row locks for long. Default 1000.
	BatchSize int
	// MaxBatches bounds one run, so a backlog is worked off over several
	// ticks instead of in one long burst. Default 100.
	MaxBatches int
	// Logger receives failed runs. Default slog.Default().
	Logger *slog.Logger
}

func (cfg JanitorConfig) withDefaults() JanitorConfig {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.MaxBatches <= 0 {
		cfg.MaxBatches = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Janitor purges idempotency keys past their retention, in bounded batches.
// Several replicas may each run one: Purge skips rows another holds.
type Janitor struct {
	store *Store
	cfg   JanitorConfig
}

// NewJanitor returns a janitor for store's keys.
func NewJanitor(store *Store, cfg JanitorConfig) *Janitor {
	return &Janitor{store: store, cfg: cfg.withDefaults()}
}

// Run purges once per Interval until ctx is done. A failed run is logged and
// retried at the next tick. It returns when ctx is done.
func (j *Janitor) Run(ctx context.Context) {
	ticker := time.NewTicker(j.cfg.Interval)
	defer ticker.Stop()
	for {
		if purged, err := j.runOnce(ctx); err != nil && ctx.Err() == nil {
			j.cfg.Logger.Error("idempotency: janitor run failed", "purged", purged, "err", err)
		} else if purged > 0 {
			j.cfg.Logger.Info("idempotency: janitor purged expired keys", "purged", purged)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// runOnce purges batch after batch until a batch comes back short (nothing
// left to purge) or MaxBatches is reached, and returns how many keys it
// purged.
func (j *Janitor) runOnce(ctx context.Context) (purged int, err error) {
	for range j.cfg.MaxBatches {
		n, err := j.store.Purge(ctx, j.cfg.BatchSize)
		purged += n
		if err != nil || n < j.cfg.BatchSize {
			return purged, err
		}
	}
	return purged, nil
}
