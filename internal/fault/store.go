package fault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
)

// Store is one fake's fault configuration and its record of late arrivals,
// in the fault schema (migrations/00020_fault.sql) under the fake's system
// name. Each exported method is one transaction, except Reset, which runs in
// the fake's own reset transaction. Several processes serving one fake on
// one database share one configuration.
type Store struct {
	pool   *pgxpool.Pool
	system string   // "provider", "payments": the rows that are this fake's
	kinds  []string // the subject kinds a fault may be scoped to
}

// NewStore returns the fault store of system, whose faults may be scoped to
// the subject kinds given ("policy", "booking").
func NewStore(pool *pgxpool.Pool, system string, kinds ...string) *Store {
	return &Store{pool: pool, system: system, kinds: kinds}
}

// Arrival is one mutating call as it reaches a fake.
type Arrival struct {
	Key      string
	Subject  Subject   // what the call is about: Policy(7), Booking(3)
	Deadline time.Time // its Request-Deadline; zero when it carries none
}

// Arrive decides how the fake treats a, in one statement (one round trip,
// one implicit transaction): a call that arrived after its deadline is
// recorded as late and refused — returned as a *LateError, nothing else
// happens, no script entry is used up — and any other call takes the fault
// that governs it: the oldest matching script entry (using it up by one),
// else its subject's override, else the global fault (Default when none was
// ever set), with flaky drawn down to a concrete mode.
//
// "Arrived" is the database clock when the statement runs, once the whole
// request has been read: a call held in the network is judged when its
// bytes get in.
func (s *Store) Arrive(ctx context.Context, a Arrival) (Call, error) {
	var deadline *time.Time
	if !a.Deadline.IsZero() {
		deadline = &a.Deadline
	}
	var (
		lateAt                   *time.Time
		scripted, standing       nullableFault
		scriptDraw, standingDraw *int64
	)
	err := s.pool.QueryRow(ctx, `
		WITH late AS (
		    -- a call that arrived after its deadline is recorded, and refused
		    INSERT INTO fault.late_arrivals (system, idempotency_key, subject, deadline, arrived_at)
		    SELECT $1, $2, $3, $4, now()
		     WHERE now() > $4
		    RETURNING arrived_at
		), entry AS (
		    -- otherwise the oldest script entry matching the call, used up by one
		    UPDATE fault.script
		       SET remaining = remaining - 1,
		           draws = draws + 1
		     WHERE id = (
		            SELECT id
		              FROM fault.script
		             WHERE system = $1
		               AND remaining > 0
		               AND (subject IS NULL OR subject = $3)
		             ORDER BY id
		             LIMIT 1
		               -- concurrent calls queue on the head entry; when it is used
		               -- up, the recheck skips it and the next entry is taken
		               FOR UPDATE
		           )
		       AND NOT EXISTS (SELECT FROM late)
		    RETURNING mode, idempotent, slow_ms, latency_ms, seed, weights, draws
		), standing AS (
		    -- else the subject's override, else the global setting
		    SELECT subject, mode, idempotent, slow_ms, latency_ms, seed, weights
		      FROM fault.settings
		     WHERE system = $1
		       AND (subject = $3 OR subject IS NULL)
		     ORDER BY subject NULLS LAST
		     LIMIT 1
		), draw AS (
		    -- a flaky standing setting hands out the next number of its
		    -- sequence; the row lock hands out each number once, across processes
		    UPDATE fault.settings s
		       SET draws = s.draws + 1
		      FROM standing
		     WHERE s.system = $1
		       AND s.subject IS NOT DISTINCT FROM standing.subject
		       AND standing.mode = 'flaky'
		       AND NOT EXISTS (SELECT FROM late)
		       AND NOT EXISTS (SELECT FROM entry)
		    RETURNING s.draws
		)
		SELECT (SELECT arrived_at FROM late),
		       e.mode, e.idempotent, e.slow_ms, e.latency_ms, e.seed, e.weights, e.draws,
		       st.mode, st.idempotent, st.slow_ms, st.latency_ms, st.seed, st.weights,
		       (SELECT draws FROM draw)
		  FROM (SELECT) AS one
		  LEFT JOIN entry e ON true
		  LEFT JOIN standing st ON true`,
		s.system, a.Key, nullable(a.Subject), deadline).
		Scan(&lateAt,
			&scripted.Mode, &scripted.Idempotent, &scripted.SlowMS, &scripted.LatencyMS, &scripted.Seed, &scripted.Weights, &scriptDraw,
			&standing.Mode, &standing.Idempotent, &standing.SlowMS, &standing.LatencyMS, &standing.Seed, &standing.Weights,
			&standingDraw)
	if err != nil {
		return Call{}, fmt.Errorf("fault: %s arrival %s: %w", s.system, a.Key, err)
	}
	if lateAt != nil {
		return Call{}, &LateError{Key: a.Key, Deadline: a.Deadline, ArrivedAt: *lateAt}
	}
	f, draw := Default(), int64(0)
	switch {
	case scripted.Mode != nil:
		f, draw = scripted.fault(), *scriptDraw
	case standing.Mode != nil:
		f = standing.fault()
		if standingDraw != nil {
			draw = *standingDraw
		}
	}
	mode := f.Mode
	if mode == ModeFlaky {
		mode = f.Weights.draw(f.Seed, draw)
	}
	return Call{
		Mode:       mode,
		Idempotent: f.Idempotent,
		Slow:       time.Duration(f.SlowMS) * time.Millisecond,
		Latency:    time.Duration(f.LatencyMS) * time.Millisecond,
	}, nil
}

// nullableFault is a fault read through a LEFT JOIN: every column may be NULL.
type nullableFault struct {
	Mode              *Mode
	Idempotent        *bool
	SlowMS, LatencyMS *int
	Seed              *int64
	Weights           Weights
}

func (n nullableFault) fault() Fault {
	return Fault{Mode: *n.Mode, Idempotent: *n.Idempotent, SlowMS: *n.SlowMS, LatencyMS: *n.LatencyMS, Seed: *n.Seed, Weights: n.Weights}
}

// StatusFault returns how status queries behave: the global fault's
// status_mode and latency.
func (s *Store) StatusFault(ctx context.Context) (StatusMode, time.Duration, error) {
	var mode StatusMode
	var latencyMS int
	err := s.pool.QueryRow(ctx, `
		SELECT status_mode, latency_ms
		  FROM fault.settings
		 WHERE system = $1
		   AND subject IS NULL`, s.system).Scan(&mode, &latencyMS)
	if errors.Is(err, pgx.ErrNoRows) {
		return StatusOK, 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("fault: %s status fault: %w", s.system, err)
	}
	return mode, time.Duration(latencyMS) * time.Millisecond, nil
}

// Config returns the whole fault configuration.
func (s *Store) Config(ctx context.Context) (Config, error) {
	cfg, err := s.readConfig(ctx, s.pool)
	if err != nil {
		return Config{}, fmt.Errorf("fault: %s faults: %w", s.system, err)
	}
	return cfg, nil
}

func (s *Store) readConfig(ctx context.Context, db database.DBTX) (Config, error) {
	cfg := Config{Global: Default(), Overrides: []Fault{}, Script: []Fault{}}
	rows, err := db.Query(ctx, `
		SELECT subject, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights
		  FROM fault.settings
		 WHERE system = $1
		 ORDER BY subject NULLS FIRST`, s.system)
	if err != nil {
		return Config{}, err
	}
	settings, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Fault, error) {
		var f Fault
		var subject *string
		err := row.Scan(&subject, &f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.StatusMode, &f.Seed, &f.Weights)
		if subject != nil {
			f.PolicyID, f.BookingID = Subject(*subject).ids()
		}
		return f, err
	})
	if err != nil {
		return Config{}, err
	}
	for _, f := range settings {
		if f.subject() == "" {
			cfg.Global = f
			continue
		}
		f.StatusMode = "" // system-wide: only the global fault's counts
		cfg.Overrides = append(cfg.Overrides, f)
	}

	rows, err = db.Query(ctx, `
		SELECT subject, mode, idempotent, slow_ms, latency_ms, seed, weights, remaining
		  FROM fault.script
		 WHERE system = $1
		   AND remaining > 0
		 ORDER BY id`, s.system)
	if err != nil {
		return Config{}, err
	}
	cfg.Script, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Fault, error) {
		var f Fault
		var subject *string
		err := row.Scan(&subject, &f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.Seed, &f.Weights, &f.Next)
		if subject != nil {
			f.PolicyID, f.BookingID = Subject(*subject).ids()
		}
		return f, err
	})
	return cfg, err
}

// Set applies one fault setting and returns the resulting configuration.
// With Next > 0 the fault is appended to the script; otherwise it replaces
// the global fault (no subject) or the subject's override, and restarts
// that fault's flaky sequence. An invalid fault returns an *InvalidError
// (wrapping ErrInvalidFault) and changes nothing.
//
// Fields are taken as they are (Idempotent false means not idempotent),
// except that nil Weights and an empty StatusMode take their defaults: to
// change one thing, start from Default().
func (s *Store) Set(ctx context.Context, f Fault) (Config, error) {
	f = f.withDefaults()
	if err := f.validate(s.system, s.kinds); err != nil {
		return Config{}, err
	}
	var cfg Config
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		if f.Next > 0 {
			// entries used up by calls are kept at 0 (Arrive is one
			// statement); appending a new one clears them away
			if _, err := tx.Exec(ctx, `DELETE FROM fault.script WHERE system = $1 AND remaining = 0`, s.system); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `
				INSERT INTO fault.script (system, subject, mode, idempotent, slow_ms, latency_ms, seed, weights, remaining)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
				s.system, nullable(f.subject()), f.Mode, f.Idempotent, f.SlowMS, f.LatencyMS, f.Seed, f.Weights, f.Next)
		} else {
			err = upsertSetting(ctx, tx, s.system, f)
		}
		if err != nil {
			return err
		}
		cfg, err = s.readConfig(ctx, tx)
		return err
	})
	if err != nil {
		return Config{}, fmt.Errorf("fault: %s set faults: %w", s.system, err)
	}
	return cfg, nil
}

// upsertSetting replaces the standing setting of f's scope.
func upsertSetting(ctx context.Context, tx pgx.Tx, system string, f Fault) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO fault.settings (system, subject, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		-- one row per scope (settings_scope_key treats a NULL subject as a value): replace it
		ON CONFLICT (system, subject) DO UPDATE
		   SET mode = EXCLUDED.mode,
		       idempotent = EXCLUDED.idempotent,
		       slow_ms = EXCLUDED.slow_ms,
		       latency_ms = EXCLUDED.latency_ms,
		       status_mode = EXCLUDED.status_mode,
		       seed = EXCLUDED.seed,
		       weights = EXCLUDED.weights,
		       draws = 0,
		       updated_at = now()`,
		system, nullable(f.subject()), f.Mode, f.Idempotent, f.SlowMS, f.LatencyMS, f.StatusMode, f.Seed, f.Weights)
	return err
}

// Reset empties the script, drops the overrides, forgets the late arrivals
// and restores Default, inside the fake's reset transaction tx, so the fake
// forgets its own state and its faults in one commit.
func (s *Store) Reset(ctx context.Context, tx pgx.Tx) error {
	batch := &pgx.Batch{}
	batch.Queue(`DELETE FROM fault.script WHERE system = $1`, s.system)
	batch.Queue(`DELETE FROM fault.settings WHERE system = $1 AND subject IS NOT NULL`, s.system)
	batch.Queue(`DELETE FROM fault.late_arrivals WHERE system = $1`, s.system)
	batch.Queue(`DELETE FROM fault.webhook_settings WHERE system = $1`, s.system)
	// The moment its records were forgotten: steps the app sent before it
	// can no longer be checked against them (the invariants read it).
	batch.Queue(`
		INSERT INTO fault.resets (system, reset_at)
		VALUES ($1, clock_timestamp())
		    ON CONFLICT (system) DO UPDATE SET reset_at = excluded.reset_at`, s.system)
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("fault: %s reset: %w", s.system, err)
	}
	if err := upsertSetting(ctx, tx, s.system, Default()); err != nil {
		return fmt.Errorf("fault: %s reset: %w", s.system, err)
	}
	return nil
}

// nullable is s as a nullable text parameter: NULL for "" (no subject).
func nullable(s Subject) *string {
	if s == "" {
		return nil
	}
	v := string(s)
	return &v
}
