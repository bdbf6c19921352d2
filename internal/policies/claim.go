package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/recovery"
)

// This file is how the recovery loop takes over operations whose owner
// looks dead: the claim, in both strategies, and the lag it reports. The
// SQL lives here, next to the table; internal/recovery only sees the
// recovery.Claimer interface (implemented by Recovery, see recover.go), so a
// later workflow with its own table brings its own claimer.

var _ recovery.Claimer = (*Recovery)(nil)

// A stale operation: live (IN_PROGRESS or RECOVERING), its lease over, its
// backoff (if any) over. $1 is the clock: NULL means the database's now().
const staleCondition = `status IN ('IN_PROGRESS', 'RECOVERING')
       AND lease_expires_at < coalesce($1::timestamptz, now()) -- its owner looks dead
       AND (next_attempt_at IS NULL OR next_attempt_at <= coalesce($1::timestamptz, now())) -- its backoff is over`

const sqlClaimSkipLocked = `
WITH stale AS (
    SELECT id AS stale_id, status AS was
      FROM policy_operations
     WHERE ` + staleCondition + `
     ORDER BY lease_expires_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED -- rows another worker is claiming right now are skipped, not waited for
)
UPDATE policy_operations
   SET status = 'RECOVERING',
       owner_token = gen_random_uuid(), -- the new fence: the old owner's writes now match nothing
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       updated_at = now()
  FROM stale
 WHERE id = stale.stale_id
RETURNING was, ` + opColumns

const sqlStaleCandidates = `
SELECT id, status
  FROM policy_operations
 WHERE ` + staleCondition + `
 ORDER BY lease_expires_at
 LIMIT $2 -- no lock: the claim below re-checks everything`

const sqlClaimTransition = `
UPDATE policy_operations
   SET status = 'RECOVERING',
       owner_token = gen_random_uuid(), -- the new fence
       owner_id = $4,
       lease_expires_at = now() + make_interval(secs => $5),
       updated_at = now()
 WHERE id = $2
   AND status = $3 -- still in the state we saw …
   AND ` + staleCondition + ` -- … and still stale: 0 rows means another worker claimed it first
RETURNING ` + opColumns

// ClaimStale claims up to req.Limit stale operations for req.Actor under a
// new owner token and a lease of req.Lease, recording a RECOVERING event
// for each in the claim's transaction. See recovery.Strategy for the two
// ways; both are safe with any number of workers.
func (r *Recovery) ClaimStale(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	switch req.Strategy {
	case recovery.SkipLocked:
		return r.claimSkipLocked(ctx, req)
	case recovery.Transition:
		return r.claimByTransition(ctx, req)
	default:
		return nil, fmt.Errorf("policies: claim: unknown strategy %q", req.Strategy)
	}
}

// claimSkipLocked claims a whole batch in one transaction: lock what nobody
// else holds, transition it, record the events, commit.
func (r *Recovery) claimSkipLocked(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	var claims []recovery.Claim
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlClaimSkipLocked, req.Now, req.Limit, req.Actor, req.Lease.Seconds())
		if err != nil {
			return err
		}
		type claimed struct {
			was string
			op  Operation
		}
		var batch []claimed
		for rows.Next() {
			var c claimed
			if c.op, err = scanOperation(prefixed{rows, []any{&c.was}}); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, c)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		claims = claims[:0] // a retried transaction starts over
		for _, c := range batch {
			if err := recordClaim(ctx, tx, c.op, c.was, req); err != nil {
				return err
			}
			claims = append(claims, claimOf(c.op, c.was, req.Actor))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policies: claim stale (skip-locked): %w", err)
	}
	return claims, nil
}

// claimByTransition reads candidates without locking, then claims each with
// one conditional UPDATE in its own short transaction. Workers that saw the
// same candidate race on the row; the loser's re-check finds it no longer
// stale and gets 0 rows.
func (r *Recovery) claimByTransition(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	rows, err := r.pool.Query(ctx, sqlStaleCandidates, req.Now, req.Limit)
	if err != nil {
		return nil, fmt.Errorf("policies: stale candidates: %w", err)
	}
	type candidate struct {
		ID     int64
		Status string
	}
	candidates, err := pgx.CollectRows(rows, pgx.RowToStructByPos[candidate])
	if err != nil {
		return nil, fmt.Errorf("policies: stale candidates: %w", err)
	}
	var claims []recovery.Claim
	for _, cand := range candidates {
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			op, err := scanOperation(tx.QueryRow(ctx, sqlClaimTransition,
				req.Now, cand.ID, cand.Status, req.Actor, req.Lease.Seconds()))
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // someone else claimed it (or it finished): not ours
			}
			if err != nil {
				return err
			}
			claims = append(claims, claimOf(op, cand.Status, req.Actor))
			return recordClaim(ctx, tx, op, cand.Status, req)
		})
		if err != nil {
			return claims, fmt.Errorf("policies: claim stale (transition): %w", err)
		}
	}
	return claims, nil
}

// BranchClaimed marks claim events on the timeline.
const BranchClaimed = "claimed"

func recordClaim(ctx context.Context, tx pgx.Tx, op Operation, was string, req recovery.ClaimRequest) error {
	statement := sqlClaimSkipLocked
	if req.Strategy == recovery.Transition {
		statement = sqlClaimTransition
	}
	detail := fmt.Sprintf("claimed for recovery (%s): the previous owner's lease had run out", req.Strategy)
	return recordBranchEvent(ctx, tx, op, &was, req.Actor, BranchClaimed, detail, statement)
}

func claimOf(op Operation, was, actor string) recovery.Claim {
	return recovery.Claim{ID: op.ID, Type: op.Type, Token: *op.OwnerToken, From: was, Actor: actor}
}

// StaleAge is how long the oldest stale operation has been claimable.
func (r *Recovery) StaleAge(ctx context.Context, now *time.Time) (time.Duration, error) {
	var secs float64
	err := r.pool.QueryRow(ctx, `
		SELECT coalesce(extract(epoch FROM
		           coalesce($1::timestamptz, now())
		           - min(greatest(lease_expires_at, coalesce(next_attempt_at, lease_expires_at)))), 0)
		  FROM policy_operations
		 WHERE `+staleCondition, now).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("policies: stale age: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// prefixed lets scanOperation read a row with extra columns in front of
// opColumns (the status a claim came from, …).
type prefixed struct {
	row   pgx.Row
	first []any
}

func (p prefixed) Scan(dest ...any) error { return p.row.Scan(append(p.first, dest...)...) }
