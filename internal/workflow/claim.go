package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/recovery"
)

// This file is how the recovery loop takes over operations of every kind:
// the claim, in both strategies, and the lag it reports. One claimer for
// the one operations table; the loop dispatches each claim by its type.

var (
	_ recovery.Claimer   = (*Engine)(nil)
	_ recovery.Recoverer = (*Engine)(nil)
)

// claimableSince is when a live operation became claimable: once its lease
// is over (its owner looks dead, or let it go) and its backoff, if any, is
// over too — greatest ignores a NULL next_attempt_at. The claim orders by
// it and the lag is measured from it, both on operations_claimable_idx.
const claimableSince = `greatest(lease_expires_at, next_attempt_at)`

// A stale operation: live (IN_PROGRESS or RECOVERING) and claimable. $1 is
// the clock (database.Clock).
var staleCondition = `status IN ('IN_PROGRESS', 'RECOVERING')
       AND ` + claimableSince + ` < ` + database.Now(1) + ` -- its lease and its backoff are over`

// claimSet is what every claim does to the operation it takes.
const claimSet = `
   SET status = 'RECOVERING',
       owner_token = gen_random_uuid(), -- the new fence: the old owner's writes now match nothing
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       released = NULL,
       updated_at = now()`

var sqlClaimSkipLocked = `
WITH stale AS (
    SELECT id AS stale_id, status AS was, released AS was_released
      FROM operations
     WHERE ` + staleCondition + `
     ORDER BY ` + claimableSince + ` -- claimable longest first
     LIMIT $2
       FOR UPDATE SKIP LOCKED -- rows another worker is claiming right now are skipped, not waited for
)
UPDATE operations` + claimSet + `
  FROM stale
 WHERE id = stale.stale_id
RETURNING was, was_released, ` + OperationColumns

var sqlStaleCandidates = `
SELECT id, status
  FROM operations
 WHERE ` + staleCondition + `
 ORDER BY ` + claimableSince + ` -- claimable longest first
 LIMIT $2 -- no lock: the claim below re-checks everything`

var sqlClaimTransition = `
WITH seen AS (
    SELECT released AS was_released
      FROM operations
     WHERE id = $2
)
UPDATE operations` + claimSet + `
  FROM seen
 WHERE id = $2
   AND status = $5 -- still in the state we saw …
   AND ` + staleCondition + ` -- … and still stale: 0 rows means another worker claimed it first
RETURNING $5::text, was_released, ` + OperationColumns

// An operation waiting for a person is asked again when next_attempt_at
// comes. The claim only moves next_attempt_at out of the other workers'
// way while it asks: status and updated_at stay, so a person's open
// decision form stays valid.
var sqlClaimReask = `
WITH due AS (
    SELECT id AS due_id
      FROM operations
     WHERE status = 'NEEDS_RECONCILIATION'
       AND next_attempt_at <= ` + database.Now(1) + `
     ORDER BY next_attempt_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED -- another worker is asking it right now
)
UPDATE operations
   SET next_attempt_at = now() + make_interval(secs => $3) -- held while asked; the question sets the next time
  FROM due
 WHERE id = due.due_id
RETURNING ` + OperationColumns

// ClaimStale claims up to req.Limit stale operations for req.Actor under a
// new owner token and a lease of req.Lease, recording a claimed event for
// each in the claim's transaction — then, with the places left, operations
// waiting for a person that are due to be asked again. See
// recovery.Strategy for the two ways; both are safe with any number of
// workers.
func (e *Engine) ClaimStale(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	var claims []recovery.Claim
	var err error
	switch req.Strategy {
	case recovery.SkipLocked:
		claims, err = e.claimSkipLocked(ctx, req)
	case recovery.Transition:
		claims, err = e.claimByTransition(ctx, req)
	default:
		return nil, fmt.Errorf("workflow: claim: unknown strategy %q", req.Strategy)
	}
	if err != nil || len(claims) >= req.Limit {
		return claims, err
	}
	reasks, err := e.claimReasks(ctx, req, req.Limit-len(claims))
	return append(claims, reasks...), err
}

// claimSkipLocked claims a whole batch in one transaction: lock what nobody
// else holds, transition it, read the steps and record the claims of the
// whole batch, commit — four statements however large the batch.
func (e *Engine) claimSkipLocked(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	var claims []recovery.Claim
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sqlClaimSkipLocked, e.cfg.Clock.Arg(), req.Limit, req.Actor, req.Lease.Seconds())
		if err != nil {
			return err
		}
		batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
			var c claimed
			var err error
			c.op, err = ScanOperation(row, &c.was, &c.released)
			return c, err
		})
		if err != nil {
			return err
		}
		claims, err = recordClaims(ctx, tx, req, batch, "workflow.sqlClaimSkipLocked")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("workflow: claim stale (skip-locked): %w", err)
	}
	return claims, nil
}

// claimByTransition reads candidates without locking, then claims each with
// one conditional UPDATE in its own short transaction. Workers that saw the
// same candidate race on the row; the loser's re-check finds it no longer
// stale and gets 0 rows.
func (e *Engine) claimByTransition(ctx context.Context, req recovery.ClaimRequest) ([]recovery.Claim, error) {
	rows, err := e.pool.Query(ctx, sqlStaleCandidates, e.cfg.Clock.Arg(), req.Limit)
	if err != nil {
		return nil, fmt.Errorf("workflow: stale candidates: %w", err)
	}
	type candidate struct {
		ID     int64
		Status string
	}
	candidates, err := pgx.CollectRows(rows, pgx.RowToStructByPos[candidate])
	if err != nil {
		return nil, fmt.Errorf("workflow: stale candidates: %w", err)
	}
	var claims []recovery.Claim
	for _, cand := range candidates {
		var got []recovery.Claim
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var c claimed
			var err error
			c.op, err = ScanOperation(tx.QueryRow(ctx, sqlClaimTransition,
				e.cfg.Clock.Arg(), cand.ID, req.Actor, req.Lease.Seconds(), cand.Status), &c.was, &c.released)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // someone else claimed it (or it finished): not ours
			}
			if err != nil {
				return err
			}
			got, err = recordClaims(ctx, tx, req, []claimed{c}, "workflow.sqlClaimTransition")
			return err
		})
		if err != nil {
			return claims, fmt.Errorf("workflow: claim stale (transition): %w", err)
		}
		claims = append(claims, got...)
	}
	return claims, nil
}

// claimReasks claims up to limit operations waiting for a person whose next
// question is due. It takes no ownership: see Engine.Recover.
func (e *Engine) claimReasks(ctx context.Context, req recovery.ClaimRequest, limit int) ([]recovery.Claim, error) {
	rows, err := e.pool.Query(ctx, sqlClaimReask, e.cfg.Clock.Arg(), limit, req.Lease.Seconds())
	if err != nil {
		return nil, fmt.Errorf("workflow: claim re-asks: %w", err)
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Operation, error) { return ScanOperation(row) })
	if err != nil {
		return nil, fmt.Errorf("workflow: claim re-asks: %w", err)
	}
	if err := withSteps(ctx, e.pool, pointers(ops)); err != nil {
		return nil, err
	}
	claims := make([]recovery.Claim, len(ops))
	for i, op := range ops {
		claims[i] = recovery.Claim{ID: op.ID, Type: op.Type, From: StatusNeedsReconciliation, Actor: req.Actor,
			Reason: "waiting for a person and due to be asked again", SeenUpdatedAt: op.UpdatedAt, Seen: op}
	}
	return claims, nil
}

// claimed is one operation a claim statement returned, with what it was.
type claimed struct {
	op       Operation
	was      string
	released *string
}

func (c claimed) asClaim(req recovery.ClaimRequest) recovery.Claim {
	return recovery.Claim{ID: c.op.ID, Type: c.op.Type, Token: *c.op.OwnerToken, From: c.was,
		Reason: claimReason(c.released), Actor: req.Actor, SeenUpdatedAt: c.op.UpdatedAt, Seen: c.op}
}

// recordClaims reads the steps of the operations just claimed — the
// recoverer starts from them (Claim.Seen) instead of reading each again —
// and records a claimed event for each, in the claim's transaction: two
// statements for the whole batch.
func recordClaims(ctx context.Context, tx pgx.Tx, req recovery.ClaimRequest, batch []claimed, statement string) ([]recovery.Claim, error) {
	ops := make([]*Operation, len(batch))
	for i := range batch {
		ops[i] = &batch[i].op
	}
	if err := withSteps(ctx, tx, ops); err != nil {
		return nil, err
	}
	claims := make([]recovery.Claim, len(batch))
	events := make([]event, len(batch))
	for i, c := range batch {
		claims[i] = c.asClaim(req)
		events[i] = event{op: c.op, from: c.was, actor: req.Actor, branch: BranchClaimed,
			detail: "claimed for recovery: " + claims[i].Reason, statement: statement}
	}
	return claims, insertEvents(ctx, tx, events)
}

// claimReason says why an operation was claimable, from how its lease ended.
func claimReason(released *string) string {
	switch database.Deref(released) {
	case ReleasedHandedOver:
		return "handed over on purpose: its owner met an outcome it could not know and ended its lease"
	case ReleasedBackedOff:
		return "its backoff is over"
	case ReleasedRetryRequested:
		return "a person asked for another try"
	default:
		return "its owner's lease ran out: the owner looks dead"
	}
}

// StaleAge is how long the oldest stale operation has been claimable.
func (e *Engine) StaleAge(ctx context.Context) (time.Duration, error) {
	var secs float64
	err := e.pool.QueryRow(ctx, `
		SELECT coalesce(extract(epoch FROM `+database.Now(1)+` - min(`+claimableSince+`)), 0)
		  FROM operations
		 WHERE `+staleCondition, e.cfg.Clock.Arg()).Scan(&secs)
	if err != nil {
		return 0, fmt.Errorf("workflow: stale age: %w", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
