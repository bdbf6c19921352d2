package fake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/provider"
)

// This file is the provider's durable state: every SQL statement it runs.
// Each exported method is one transaction.

// errKeyReused reports a key already used for another policy. A real
// provider refuses that: one key names one request.
var errKeyReused = errors.New("fake: idempotency key reused for a different policy")

// call is one cancellation call the provider processes.
type call struct {
	key      string
	policyID int64
	reason   string
	fault    callFault
}

// accepted reports whether the call's mode carries out the cancellation
// (now, or after slow_ms); reject refuses it.
func (c call) accepted() bool { return c.fault.mode != ModeReject }

// completesIn is how long after receipt an accepted call completes.
func (c call) completesIn() time.Duration {
	if c.fault.mode == ModeSlow {
		return c.fault.slow
	}
	return 0
}

// request is the provider's record of a key, with its truth computed at read time.
type request struct {
	Key          string
	PolicyID     int64
	Truth        provider.Truth
	RejectReason string
	Attempts     int
	ReceivedAt   time.Time
	CompletesAt  time.Time
	// untilComplete is how long a RUNNING request still has to go (0 otherwise).
	untilComplete time.Duration
}

const rejectReason = "the provider refuses to cancel this policy (fault mode reject)"

// receive processes one call in one transaction and returns the key's record
// afterwards. This is where the idempotency switch lives:
//
//   - The first call with a key inserts the request row and, if accepted,
//     applies the effect, in the same commit.
//   - A repeat on an idempotent provider only counts the attempt: no effect,
//     and the record (the first outcome) is what it answers.
//   - A repeat on a provider that is not idempotent is processed again: a
//     second effect row, which is the double cancellation the app must avoid.
//
// Two concurrent first calls with one key cannot both insert: the primary key
// makes the second INSERT … ON CONFLICT wait for the first to commit, then it
// finds the row and takes the repeat path. So an idempotent provider applies
// one effect however many copies race, with no lock of our own.
func (p *Provider) receive(ctx context.Context, c call) (request, error) {
	var rec request
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		first, err := insertRequest(ctx, tx, c)
		if err != nil {
			return err
		}
		switch {
		case first:
			if c.accepted() {
				if err := applyEffect(ctx, tx, c); err != nil {
					return err
				}
			}
		default:
			policyID, err := countAttempt(ctx, tx, c.key)
			if err != nil {
				return err
			}
			if policyID != c.policyID {
				return errKeyReused // rolls back the attempt count too
			}
			if !c.fault.idempotent && c.accepted() {
				if err := applyEffect(ctx, tx, c); err != nil {
					return err
				}
				if err := acceptAgain(ctx, tx, c); err != nil {
					return err
				}
			}
		}
		rec, err = readRequest(ctx, tx, c.key, nil)
		return err
	})
	if err != nil {
		return request{}, fmt.Errorf("fake: receive %s: %w", c.key, err)
	}
	return rec, nil
}

// insertRequest records the first call with a key and reports whether this
// call was it.
func insertRequest(ctx context.Context, tx pgx.Tx, c call) (bool, error) {
	outcome, reason := "ACCEPTED", (*string)(nil)
	if !c.accepted() {
		outcome, reason = "REJECTED", ptr(rejectReason)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO fake_provider.requests (idempotency_key, policy_id, reason, outcome, reject_reason, completes_at)
		VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 millisecond')
		-- the key is known (or a concurrent first call holds it; we wait for it): a repeat
		ON CONFLICT (idempotency_key) DO NOTHING`,
		c.key, c.policyID, c.reason, outcome, reason, c.completesIn().Milliseconds())
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// countAttempt counts a repeat and returns the policy the key belongs to. The
// UPDATE's row lock also serialises concurrent repeats of one key.
func countAttempt(ctx context.Context, tx pgx.Tx, key string) (int64, error) {
	var policyID int64
	err := tx.QueryRow(ctx, `
		UPDATE fake_provider.requests
		   SET attempts = attempts + 1,
		       last_received_at = now()
		 WHERE idempotency_key = $1
		RETURNING policy_id`, key).Scan(&policyID)
	return policyID, err
}

// acceptAgain updates the record of a key after a non-idempotent repeat was
// accepted: an acceptance overrides an earlier refusal, and the earliest
// completion stands (the first effect takes hold then, whatever follows).
func acceptAgain(ctx context.Context, tx pgx.Tx, c call) error {
	_, err := tx.Exec(ctx, `
		UPDATE fake_provider.requests
		   SET outcome = 'ACCEPTED',
		       reject_reason = NULL,
		       completes_at = CASE
		           WHEN outcome = 'ACCEPTED' THEN least(completes_at, now() + $2 * interval '1 millisecond')
		           ELSE now() + $2 * interval '1 millisecond'
		       END
		 WHERE idempotency_key = $1`,
		c.key, c.completesIn().Milliseconds())
	return err
}

// applyEffect writes one row to the effects ledger: the cancellation itself.
// A slow call's effect is written at acceptance with applied_at in the
// future, so it is durable at once and counts from its completion on; the
// ledger thus never needs a background process either.
func applyEffect(ctx context.Context, tx pgx.Tx, c call) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
		VALUES ($1, $2, now() + $3 * interval '1 millisecond')`,
		c.key, c.policyID, c.completesIn().Milliseconds())
	return err
}

// readRequest returns the record of key as of at (nil: the database clock).
// pgx.ErrNoRows means the provider never processed the key: NOT_STARTED.
func readRequest(ctx context.Context, db database.DBTX, key string, at *time.Time) (request, error) {
	var r request
	var reason *string
	var untilMS float64
	err := db.QueryRow(ctx, `
		SELECT idempotency_key,
		       policy_id,
		       fake_provider.truth(outcome, completes_at, coalesce($2::timestamptz, now())),
		       reject_reason,
		       attempts,
		       received_at,
		       completes_at,
		       extract(epoch FROM greatest(completes_at - coalesce($2::timestamptz, now()), interval '0')) * 1000
		  FROM fake_provider.requests
		 WHERE idempotency_key = $1`, key, at).
		Scan(&r.Key, &r.PolicyID, &r.Truth, &reason, &r.Attempts, &r.ReceivedAt, &r.CompletesAt, &untilMS)
	if err != nil {
		return request{}, err
	}
	if reason != nil {
		r.RejectReason = *reason
	}
	if r.Truth == provider.TruthRunning {
		r.untilComplete = time.Duration(untilMS * float64(time.Millisecond))
	}
	return r, nil
}

// Truth returns the provider's truth for key now, by the database clock.
func (p *Provider) Truth(ctx context.Context, key string) (provider.Truth, error) {
	return p.truth(ctx, key, nil)
}

// TruthAt returns the provider's truth for key as it will be (or was) at at,
// so tests can see a slow request complete without sleeping.
func (p *Provider) TruthAt(ctx context.Context, key string, at time.Time) (provider.Truth, error) {
	return p.truth(ctx, key, &at)
}

func (p *Provider) truth(ctx context.Context, key string, at *time.Time) (provider.Truth, error) {
	r, err := readRequest(ctx, p.pool, key, at)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return provider.TruthNotStarted, nil
	case err != nil:
		return "", fmt.Errorf("fake: truth of %s: %w", key, err)
	}
	return r.Truth, nil
}

// Effects is the effects ledger summed up, the JSON of GET /v1/effects.
type Effects struct {
	// Total counts effects that have taken hold.
	Total int64 `json:"total"`
	// Pending counts effects of slow calls accepted but not yet complete.
	Pending  int64          `json:"pending"`
	ByPolicy []PolicyEffect `json:"by_policy"`
}

// PolicyEffect is one policy's line in the ledger. Count above 1 is a double
// cancellation; an invariant check should add Pending, which will become
// Count by itself.
type PolicyEffect struct {
	PolicyID int64 `json:"policy_id"`
	Count    int64 `json:"count"`
	Pending  int64 `json:"pending"`
}

// Effects sums up the ledger now, by the database clock.
func (p *Provider) Effects(ctx context.Context) (Effects, error) { return p.effects(ctx, nil) }

// EffectsAt sums up the ledger as of at, so tests can see scheduled effects
// take hold without sleeping.
func (p *Provider) EffectsAt(ctx context.Context, at time.Time) (Effects, error) {
	return p.effects(ctx, &at)
}

func (p *Provider) effects(ctx context.Context, at *time.Time) (Effects, error) {
	rows, err := p.pool.Query(ctx, `
		SELECT policy_id,
		       count(*) FILTER (WHERE applied_at <= coalesce($1::timestamptz, now())),
		       count(*) FILTER (WHERE applied_at > coalesce($1::timestamptz, now()))
		  FROM fake_provider.effects
		 GROUP BY policy_id
		 ORDER BY policy_id`, at)
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	byPolicy, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PolicyEffect])
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	e := Effects{ByPolicy: byPolicy}
	for _, pe := range byPolicy {
		e.Total += pe.Count
		e.Pending += pe.Pending
	}
	return e, nil
}

// resolveFault decides which fault governs the next call for policyID:
// the oldest matching script entry (using it up by one), else the policy's
// override, else the global fault; a flaky fault is then drawn down to a
// concrete mode.
func (p *Provider) resolveFault(ctx context.Context, policyID int64) (callFault, error) {
	var f Fault
	var draw int64
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var scripted bool
		var err error
		f, draw, scripted, err = takeScriptEntry(ctx, tx, policyID)
		if err != nil || scripted {
			return err
		}
		if err := tx.QueryRow(ctx, `
			SELECT mode, idempotent, slow_ms, latency_ms, seed, weights, policy_id
			  FROM fake_provider.faults
			 WHERE policy_id = $1 OR policy_id IS NULL
			 ORDER BY policy_id NULLS LAST -- the override, when there is one
			 LIMIT 1`, policyID).
			Scan(&f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.Seed, &f.Weights, &f.PolicyID); err != nil {
			return err
		}
		if f.Mode != ModeFlaky {
			return nil
		}
		// Each flaky call takes the next number of its fault's sequence; the
		// row lock hands out each number once, across replicas.
		return tx.QueryRow(ctx, `
			UPDATE fake_provider.faults
			   SET draws = draws + 1
			 WHERE policy_id IS NOT DISTINCT FROM $1
			RETURNING draws`, f.PolicyID).Scan(&draw)
	})
	if err != nil {
		return callFault{}, fmt.Errorf("fake: resolve fault: %w", err)
	}
	mode := f.Mode
	if mode == ModeFlaky {
		mode = f.Weights.draw(f.Seed, draw)
	}
	return callFault{
		mode:       mode,
		idempotent: f.Idempotent,
		slow:       time.Duration(f.SlowMS) * time.Millisecond,
		latency:    time.Duration(f.LatencyMS) * time.Millisecond,
	}, nil
}

// takeScriptEntry uses up one call of the oldest script entry matching
// policyID, if any, and returns it with its draw number.
func takeScriptEntry(ctx context.Context, tx pgx.Tx, policyID int64) (f Fault, draw int64, ok bool, err error) {
	var id int64
	var remaining int
	err = tx.QueryRow(ctx, `
		UPDATE fake_provider.fault_script
		   SET remaining = remaining - 1,
		       draws = draws + 1
		 WHERE id = (
		        SELECT id
		          FROM fake_provider.fault_script
		         WHERE remaining > 0
		           AND (policy_id IS NULL OR policy_id = $1)
		         ORDER BY id
		         LIMIT 1
		           -- concurrent calls queue on the head entry; when it is used
		           -- up, the recheck skips it and the next entry is taken
		           FOR UPDATE
		       )
		RETURNING id, remaining, mode, idempotent, slow_ms, latency_ms, seed, weights, draws`, policyID).
		Scan(&id, &remaining, &f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.Seed, &f.Weights, &draw)
	if errors.Is(err, pgx.ErrNoRows) {
		return Fault{}, 0, false, nil
	}
	if err != nil {
		return Fault{}, 0, false, err
	}
	if remaining == 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM fake_provider.fault_script WHERE id = $1`, id); err != nil {
			return Fault{}, 0, false, err
		}
	}
	return f, draw, true, nil
}

// statusFault returns how status queries behave: the global fault's
// status_mode and latency.
func (p *Provider) statusFault(ctx context.Context) (StatusMode, time.Duration, error) {
	var mode StatusMode
	var latencyMS int
	err := p.pool.QueryRow(ctx, `
		SELECT status_mode, latency_ms
		  FROM fake_provider.faults
		 WHERE policy_id IS NULL`).Scan(&mode, &latencyMS)
	if err != nil {
		return "", 0, fmt.Errorf("fake: status fault: %w", err)
	}
	return mode, time.Duration(latencyMS) * time.Millisecond, nil
}

// Faults returns the whole fault configuration.
func (p *Provider) Faults(ctx context.Context) (Config, error) {
	cfg, err := readConfig(ctx, p.pool)
	if err != nil {
		return Config{}, fmt.Errorf("fake: faults: %w", err)
	}
	return cfg, nil
}

func readConfig(ctx context.Context, db database.DBTX) (Config, error) {
	cfg := Config{Overrides: []Fault{}, Script: []Fault{}}
	rows, err := db.Query(ctx, `
		SELECT policy_id, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights
		  FROM fake_provider.faults
		 ORDER BY policy_id NULLS FIRST`)
	if err != nil {
		return Config{}, err
	}
	faults, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Fault, error) {
		var f Fault
		err := row.Scan(&f.PolicyID, &f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.StatusMode, &f.Seed, &f.Weights)
		return f, err
	})
	if err != nil {
		return Config{}, err
	}
	for _, f := range faults {
		if f.PolicyID == nil {
			cfg.Global = f
			continue
		}
		f.StatusMode = "" // provider-wide: only the global fault's counts
		cfg.Overrides = append(cfg.Overrides, f)
	}

	rows, err = db.Query(ctx, `
		SELECT policy_id, mode, idempotent, slow_ms, latency_ms, seed, weights, remaining
		  FROM fake_provider.fault_script
		 WHERE remaining > 0
		 ORDER BY id`)
	if err != nil {
		return Config{}, err
	}
	cfg.Script, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Fault, error) {
		var f Fault
		err := row.Scan(&f.PolicyID, &f.Mode, &f.Idempotent, &f.SlowMS, &f.LatencyMS, &f.Seed, &f.Weights, &f.Next)
		return f, err
	})
	return cfg, err
}

// SetFaults applies one fault setting and returns the resulting
// configuration. With Next > 0 the fault is appended to the script;
// otherwise it replaces the global fault (PolicyID nil) or the policy's
// override, and restarts that fault's flaky sequence. An invalid fault
// returns an error wrapping ErrInvalidFault and changes nothing.
//
// Fields are taken as they are (Idempotent false means not idempotent),
// except that nil Weights and an empty StatusMode take their defaults: to
// change one thing, start from DefaultFault().
func (p *Provider) SetFaults(ctx context.Context, f Fault) (Config, error) {
	if f.Weights == nil {
		f.Weights = DefaultWeights()
	}
	if f.StatusMode == "" {
		f.StatusMode = StatusOK
	}
	if err := f.validate(); err != nil {
		return Config{}, err
	}
	var cfg Config
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		if f.Next > 0 {
			_, err = tx.Exec(ctx, `
				INSERT INTO fake_provider.fault_script (policy_id, mode, idempotent, slow_ms, latency_ms, seed, weights, remaining)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
				f.PolicyID, f.Mode, f.Idempotent, f.SlowMS, f.LatencyMS, f.Seed, f.Weights, f.Next)
		} else {
			_, err = tx.Exec(ctx, `
				INSERT INTO fake_provider.faults (policy_id, mode, idempotent, slow_ms, latency_ms, status_mode, seed, weights)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
				-- one row per scope (faults_policy_id_key treats NULL as a value): replace it
				ON CONFLICT (policy_id) DO UPDATE
				   SET mode = EXCLUDED.mode,
				       idempotent = EXCLUDED.idempotent,
				       slow_ms = EXCLUDED.slow_ms,
				       latency_ms = EXCLUDED.latency_ms,
				       status_mode = EXCLUDED.status_mode,
				       seed = EXCLUDED.seed,
				       weights = EXCLUDED.weights,
				       draws = 0,
				       updated_at = now()`,
				f.PolicyID, f.Mode, f.Idempotent, f.SlowMS, f.LatencyMS, f.StatusMode, f.Seed, f.Weights)
		}
		if err != nil {
			return err
		}
		cfg, err = readConfig(ctx, tx)
		return err
	})
	if err != nil {
		return Config{}, fmt.Errorf("fake: set faults: %w", err)
	}
	return cfg, nil
}

// Reset forgets every request and effect, empties the script, drops the
// overrides and restores DefaultFault, in one transaction.
func (p *Provider) Reset(ctx context.Context) error {
	d := DefaultFault()
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue(`DELETE FROM fake_provider.effects`)
		batch.Queue(`DELETE FROM fake_provider.requests`)
		batch.Queue(`DELETE FROM fake_provider.fault_script`)
		batch.Queue(`DELETE FROM fake_provider.faults WHERE policy_id IS NOT NULL`)
		batch.Queue(`
			UPDATE fake_provider.faults
			   SET mode = $1, idempotent = $2, slow_ms = $3, latency_ms = $4,
			       status_mode = $5, seed = $6, weights = $7, draws = 0, updated_at = now()
			 WHERE policy_id IS NULL`,
			d.Mode, d.Idempotent, d.SlowMS, d.LatencyMS, d.StatusMode, d.Seed, d.Weights)
		return tx.SendBatch(ctx, batch).Close()
	})
	if err != nil {
		return fmt.Errorf("fake: reset: %w", err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
