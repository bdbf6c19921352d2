package labs

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/pause"
)

// What several scenarios share: their effects table, fingerprints, waits.

// effect records one effect of the lab's work, in the caller's transaction:
// it commits with the rest of that work or not at all.
func (e *env) effect(ctx context.Context, tx pgx.Tx, lab, variant, actor, what string) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO effects (run_id, variant, actor, what)
		VALUES ($1, $2, $3, $4)`, e.run, lab+"/"+variant, actor, what)
	if err != nil {
		return fmt.Errorf("labs: effect: %w", err)
	}
	return nil
}

// countEffects counts the effects a variant committed.
func (e *env) countEffects(ctx context.Context, lab, variant string) (int, error) {
	var n int
	err := e.lab.QueryRow(ctx, `
		SELECT count(*)
		  FROM effects
		 WHERE run_id = $1
		   AND variant = $2`, e.run, lab+"/"+variant).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("labs: count effects: %w", err)
	}
	return n, nil
}

// fingerprintOf stands for the fingerprint of one request: a SHA-256, as
// the key table requires; the same parts give the same request.
func fingerprintOf(parts ...string) []byte {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return sum[:]
}

// waitFor polls cond every 10 ms until it holds, up to bound. It is for
// waiting on something the schedule guarantees will happen (a held call
// the proxy delivers, a lease the database clock ends), never for hoping.
func waitFor(ctx context.Context, bound time.Duration, cond func() (bool, error)) error {
	return pollEvery(ctx, bound, 10*time.Millisecond, cond)
}

// pollEvery is waitFor at another pace.
func pollEvery(ctx context.Context, bound, every time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(bound)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("labs: waited %s for the schedule to play out", bound)
		}
		if !pause.For(ctx, every) {
			return ctx.Err()
		}
	}
}
