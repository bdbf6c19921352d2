package fake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/fault"
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
	fault    fault.Call
}

// accepted reports whether the call's mode carries out the cancellation
// (now, or after slow_ms); reject refuses it.
func (c call) accepted() bool { return c.fault.Accepted() }

// completesIn is how long after receipt an accepted call completes.
func (c call) completesIn() time.Duration { return c.fault.CompletesIn() }

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
			if !c.fault.Idempotent && c.accepted() {
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
	// Late lists the calls refused for arriving after their deadline
	// (nothing applied); left out when there are none.
	Late *fault.LateArrivals `json:"late,omitempty"`
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
	late, err := p.faults.Late(ctx, p.pool)
	if err != nil {
		return Effects{}, fmt.Errorf("fake: effects: %w", err)
	}
	if late.Total > 0 {
		e.Late = &late
	}
	return e, nil
}

// Reset forgets every request, effect and late arrival, empties the
// script, drops the overrides and restores DefaultFault, in one transaction.
func (p *Provider) Reset(ctx context.Context) error {
	err := pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue(`DELETE FROM fake_provider.effects`)
		batch.Queue(`DELETE FROM fake_provider.requests`)
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		return p.faults.Reset(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("fake: reset: %w", err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
