package operations

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemlab/idemlab/internal/database"
)

// JanitorConfig configures a Janitor. Zero fields take the defaults.
type JanitorConfig struct {
	// Retention is how long a finished operation is kept after it finished
	// (OPERATIONS_RETENTION). Default 30 days.
	Retention time.Duration
	// Interval between runs. Default 1 minute.
	Interval time.Duration
	// BatchSize is how many operations one statement purges, with their
	// steps, calls, timeline, decisions and audit lines. Default 500.
	BatchSize int
	// MaxBatches bounds one run. Default 100.
	MaxBatches int
	// Clock is the clock the cutoff is measured from: nil, the database's
	// now(); tests move it instead of waiting a month.
	Clock *database.Clock
	// Logger receives failed runs. Default slog.Default().
	Logger *slog.Logger
}

func (cfg JanitorConfig) withDefaults() JanitorConfig {
	if cfg.Retention <= 0 {
		cfg.Retention = 30 * 24 * time.Hour
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 500
	}
	if cfg.MaxBatches <= 0 {
		cfg.MaxBatches = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Janitor purges operations that finished more than Retention ago, with
// everything hanging from them, in bounded batches. Several replicas may
// each run one: a batch skips rows another holds.
type Janitor struct {
	db  database.DBTX
	cfg JanitorConfig
}

// NewJanitor returns a janitor over db.
func NewJanitor(db database.DBTX, cfg JanitorConfig) *Janitor {
	return &Janitor{db: db, cfg: cfg.withDefaults()}
}

// Run purges once per Interval until ctx is done; a failed run is logged and
// tried again at the next tick.
func (j *Janitor) Run(ctx context.Context) {
	ticker := time.NewTicker(j.cfg.Interval)
	defer ticker.Stop()
	for {
		if purged, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.cfg.Logger.Error("operations: retention run failed", "purged", purged, "err", err)
		} else if purged > 0 {
			j.cfg.Logger.Info("operations: purged finished operations", "purged", purged, "retention", j.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// RunOnce purges batch after batch until one comes back short or
// MaxBatches is reached, and returns how many operations it purged. Run
// calls it on every tick; tests call it directly.
func (j *Janitor) RunOnce(ctx context.Context) (purged int, err error) {
	for range j.cfg.MaxBatches {
		n, err := j.purge(ctx)
		purged += n
		if err != nil || n < j.cfg.BatchSize {
			return purged, err
		}
	}
	return purged, nil
}

// sqlPurge deletes one batch of finished operations and what hangs from
// them, in one statement: the foreign keys are checked at its end, when
// every referencing row is gone with its operation.
const sqlPurge = `
WITH doomed AS (
    SELECT o.id
      FROM operations o
     WHERE o.status IN ('SUCCEEDED', 'FAILED') -- never a live one, nor one waiting for a person
       AND o.finished_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
       -- A deposit booking's operation holds the charge's key, which a
       -- cancellation of the booking refunds: kept while the booking stands.
       AND NOT EXISTS (SELECT 1
                         FROM bookings b
                        WHERE b.id = o.booking_id
                          AND o.operation_type = 'BOOK_DEPOSIT'
                          AND b.status IN ('PENDING', 'CONFIRMED'))
     ORDER BY o.finished_at
     LIMIT $3
       FOR UPDATE OF o SKIP LOCKED -- a row a request or another janitor holds: the next run's
), decisions AS (
    DELETE FROM reconciliation_decisions d USING doomed WHERE d.operation_id = doomed.id
), audit AS (
    DELETE FROM audit_entries a USING doomed WHERE a.operation_id = doomed.id
), timeline AS (
    DELETE FROM operation_timeline t USING doomed WHERE t.operation_id = doomed.id
), calls AS (
    DELETE FROM operation_calls c USING doomed WHERE c.operation_id = doomed.id
), steps AS (
    DELETE FROM operation_steps s USING doomed WHERE s.operation_id = doomed.id
)
DELETE FROM operations o
 USING doomed
 WHERE o.id = doomed.id
   AND o.status IN ('SUCCEEDED', 'FAILED') -- still finished: the lock held it so`

// purge purges one batch and returns how many operations it removed.
func (j *Janitor) purge(ctx context.Context) (int, error) {
	tag, err := j.db.Exec(ctx, sqlPurge, j.cfg.Clock.Arg(), j.cfg.Retention.Seconds(), j.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("operations: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}
