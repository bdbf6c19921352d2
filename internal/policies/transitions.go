package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file holds every write to an operation. Each is one conditional
// statement; every write by an owner carries `AND owner_token = $mine`
// (the fence), and zero rows means ErrLeaseLost. Each also appends its
// timeline event in the same transaction, quoting its own SQL.

// Owner identifies who is acting: a request or a recovery worker.
type Owner struct {
	// ID says who, for people: "request 3f2c… on app-1", "recovery on app-2".
	ID string
	// Lease is how long the owner may act before others may take over.
	Lease time.Duration
}

const sqlStartOperation = `
INSERT INTO policy_operations
       (policy_id, operation_type, user_id, idempotency_key, reason, status,
        owner_token, owner_id, lease_expires_at, provider_key, steps)
SELECT id, 'CANCEL', user_id, $3, $4, 'IN_PROGRESS',
       gen_random_uuid(), $5, now() + make_interval(secs => $6),
       format('policy-%s-cancel-1', id),
       '{"record_intent": "DONE", "provider_cancel": "PENDING", "mark_cancelled": "PENDING"}'
  FROM policies
 WHERE id = $1
   AND user_id = $2 -- someone else's policy inserts nothing
   AND status = 'ACTIVE'
-- No conflict target: every unique index is an arbiter. The intent exists
-- already when (policy_id, operation_type) conflicts — and so does its
-- provider_key, which a racing insert of the same intent may hit first; as a
-- non-arbiter that would be a 23505 error instead of 0 rows.
    ON CONFLICT DO NOTHING
RETURNING ` + opColumns

const sqlRestartOperation = `
UPDATE policy_operations
   SET status = 'IN_PROGRESS',
       run = run + 1,
       provider_key = format('policy-%s-cancel-%s', policy_id, run + 1),
       idempotency_key = $2,
       reason = $3,
       owner_token = gen_random_uuid(),
       owner_id = $4,
       lease_expires_at = now() + make_interval(secs => $5),
       attempts = 0,
       next_attempt_at = NULL,
       provider_truth = NULL,
       last_error = NULL,
       finished_at = NULL,
       steps = '{"record_intent": "DONE", "provider_cancel": "PENDING", "mark_cancelled": "PENDING"}',
       updated_at = now()
 WHERE id = $1
   AND status = 'FAILED' -- 0 rows: someone restarted it first
RETURNING ` + opColumns

// StartCancellation records the intent to cancel policyID and makes owner
// its owner under a lease, in tx. A FAILED earlier cancellation is started
// again (same row, next run, new provider key). It returns ErrNotFound when
// the policy does not exist, is not the user's, or is not ACTIVE without an
// operation; and a *DuplicateIntentError when a cancellation that is not
// FAILED exists, or when requestKey itself started it (SameRequest).
func (s *Store) StartCancellation(ctx context.Context, tx pgx.Tx, userID, policyID int64, requestKey, reason string, owner Owner) (Operation, error) {
	op, err := scanOperation(tx.QueryRow(ctx, sqlStartOperation,
		policyID, userID, requestKey, reason, owner.ID, owner.Lease.Seconds()))
	if err == nil {
		return op, recordEvent(ctx, tx, op, nil, owner.ID, "cancellation requested", sqlStartOperation)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, fmt.Errorf("policies: start cancellation: %w", err)
	}

	// Nothing inserted: no such (active) policy of this user, or the intent exists.
	existing, err := scanOperation(tx.QueryRow(ctx, `
		SELECT `+opColumns+`
		  FROM policy_operations
		 WHERE policy_id = $1
		   AND operation_type = 'CANCEL'
		   AND user_id = $2`, policyID, userID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: start cancellation: %w", err)
	}
	if existing.IdempotencyKey == requestKey {
		return Operation{}, &DuplicateIntentError{OperationID: existing.ID, Status: existing.Status, SameRequest: true}
	}
	if existing.Status != OpFailed {
		return Operation{}, &DuplicateIntentError{OperationID: existing.ID, Status: existing.Status}
	}
	op, err = scanOperation(tx.QueryRow(ctx, sqlRestartOperation,
		existing.ID, requestKey, reason, owner.ID, owner.Lease.Seconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, &DuplicateIntentError{OperationID: existing.ID, Status: OpInProgress}
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: restart cancellation: %w", err)
	}
	return op, recordEvent(ctx, tx, op, ptr(OpFailed), owner.ID,
		fmt.Sprintf("cancellation requested again (run %d)", op.Run), sqlRestartOperation)
}

const sqlSucceed = `
UPDATE policy_operations
   SET status = 'SUCCEEDED',
       provider_truth = 'COMPLETED',
       steps = steps || '{"provider_cancel": "DONE", "mark_cancelled": "DONE"}',
       finished_at = now(),
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence: 0 rows means we no longer own it
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

const sqlMarkPolicyCancelled = `
UPDATE policies
   SET status = 'CANCELLED',
       updated_at = now()
 WHERE id = $1
   AND status = 'ACTIVE'`

// Succeed finishes the operation: the provider confirmed the cancellation.
// In tx, the operation becomes SUCCEEDED and the policy CANCELLED — both or
// neither, and only while token still owns the operation (else
// ErrLeaseLost, and the caller must roll tx back).
func (s *Store) Succeed(ctx context.Context, tx pgx.Tx, opID int64, token, actor, detail string) (Operation, error) {
	return s.succeed(ctx, tx, opID, token, note{actor: actor, detail: detail})
}

// note is what a transition writes on the timeline: who, which branch of
// the recovery decision tree (if any), and why.
type note struct {
	actor, branch, detail string
}

func (s *Store) succeed(ctx context.Context, tx pgx.Tx, opID int64, token string, n note) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlSucceed)
	if err != nil {
		return Operation{}, err
	}
	if _, err := tx.Exec(ctx, sqlMarkPolicyCancelled, op.PolicyID); err != nil {
		return Operation{}, fmt.Errorf("policies: mark policy cancelled: %w", err)
	}
	return op, recordBranchEvent(ctx, tx, op, &from, n.actor, n.branch, n.detail, sqlSucceed+";\n"+sqlMarkPolicyCancelled)
}

const sqlFail = `
UPDATE policy_operations
   SET status = 'FAILED',
       provider_truth = $3,
       last_error = $4,
       steps = steps || '{"provider_cancel": "FAILED"}',
       finished_at = now(),
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

// Fail finishes the operation as FAILED: the provider refused definitively
// (truth is what it said, e.g. REJECTED). The policy stays ACTIVE and a
// later request may start the cancellation again.
func (s *Store) Fail(ctx context.Context, tx pgx.Tx, opID int64, token, truth, why, actor string) (Operation, error) {
	return s.fail(ctx, tx, opID, token, truth, why, note{actor: actor, detail: why})
}

func (s *Store) fail(ctx context.Context, tx pgx.Tx, opID int64, token, truth, why string, n note) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlFail, truth, why)
	if err != nil {
		return Operation{}, err
	}
	return op, recordBranchEvent(ctx, tx, op, &from, n.actor, n.branch, n.detail, sqlFail)
}

const sqlHandOver = `
UPDATE policy_operations
   SET lease_expires_at = now(), -- expired now: the recovery loop may claim it at once
       next_attempt_at = now(),
       attempts = attempts + 1,
       last_error = $3,
       steps = steps || '{"provider_cancel": "UNKNOWN"}',
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

// HandOver records that the provider's answer is unknown (a timeout, a
// reset connection, a 5xx) and gives the operation up to recovery: it stays
// IN_PROGRESS — missing information, not a failure — with its lease ended,
// so the recovery loop claims it at its next pass instead of waiting for the
// lease to run out.
func (s *Store) HandOver(ctx context.Context, tx pgx.Tx, opID int64, token, why, actor string) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlHandOver, why)
	if err != nil {
		return Operation{}, err
	}
	return op, recordEvent(ctx, tx, op, &from, actor, "provider outcome unknown, handed to recovery: "+why, sqlHandOver)
}

const sqlRecordRetry = `
UPDATE policy_operations
   SET updated_at = now()
 WHERE id = $1
RETURNING ` + opColumns

// RecordRetry notes on the timeline that the request which started the
// operation came back (its process died before answering, and the client
// retried with the same key) and returns the operation as it is now. It
// changes no state: the answer is whatever the operation has become.
func (s *Store) RecordRetry(ctx context.Context, tx pgx.Tx, opID int64, actor string) (Operation, error) {
	op, err := scanOperation(tx.QueryRow(ctx, sqlRecordRetry, opID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrOperationNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: record retry: %w", err)
	}
	return op, recordEvent(ctx, tx, op, &op.Status, actor,
		"the request that started this operation was retried with the same key: answered with the current state", sqlRecordRetry)
}

const sqlRenewLease = `
UPDATE policy_operations
   SET lease_expires_at = now() + make_interval(secs => $3), -- covers the next wait and the call after it
       provider_truth = $4, -- what the last status query said (NULL: it could not be asked)
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence: a worker that lost the operation stops here
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

// RenewLease extends the owner's lease by d from now (database clock), as a
// recovery worker does before every wait while it polls, and notes the
// provider's truth as last seen ("" when it could not be asked). It
// returns ErrLeaseLost when token no longer owns the operation: the worker
// must stop, having written nothing.
func (s *Store) RenewLease(ctx context.Context, tx pgx.Tx, opID int64, token string, d time.Duration, truth string, n note) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlRenewLease, d.Seconds(), nullable(truth))
	if err != nil {
		return Operation{}, err
	}
	return op, recordBranchEvent(ctx, tx, op, &from, n.actor, n.branch, n.detail, sqlRenewLease)
}

const sqlBackOff = `
UPDATE policy_operations
   SET attempts = attempts + 1,
       next_attempt_at = now() + make_interval(secs => $3), -- no worker claims it before then
       lease_expires_at = now(), -- released: claimable again once next_attempt_at passes
       provider_truth = $4,
       last_error = $5,
       steps = steps || '{"provider_cancel": "UNKNOWN"}',
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

// BackOff records an attempt that did not learn the outcome and makes the
// operation claimable again after wait. It stays RECOVERING: still missing
// information, not a failure.
func (s *Store) BackOff(ctx context.Context, tx pgx.Tx, opID int64, token string, wait time.Duration, truth, why string, n note) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlBackOff, wait.Seconds(), nullable(truth), why)
	if err != nil {
		return Operation{}, err
	}
	return op, recordBranchEvent(ctx, tx, op, &from, n.actor, n.branch, n.detail, sqlBackOff)
}

const sqlNeedsReconciliation = `
UPDATE policy_operations
   SET status = 'NEEDS_RECONCILIATION',
       attempts = attempts + 1,
       next_attempt_at = NULL, -- no worker will touch it again: a person decides
       provider_truth = $3,
       last_error = $4,
       steps = steps || '{"provider_cancel": "UNKNOWN"}',
       updated_at = now()
 WHERE id = $1
   AND owner_token = $2 -- the fence
   AND status IN ('IN_PROGRESS', 'RECOVERING')
RETURNING ` + opColumns

// SendToReconciliation gives up on finding the outcome automatically: the
// operation waits for a person (the reconciliation page), with why and the
// timeline as evidence.
func (s *Store) SendToReconciliation(ctx context.Context, tx pgx.Tx, opID int64, token, truth, why string, n note) (Operation, error) {
	op, from, err := s.fencedUpdate(ctx, tx, opID, token, sqlNeedsReconciliation, nullable(truth), why)
	if err != nil {
		return Operation{}, err
	}
	return op, recordBranchEvent(ctx, tx, op, &from, n.actor, n.branch, n.detail, sqlNeedsReconciliation)
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// fencedUpdate runs one owner's UPDATE … RETURNING and tells the previous
// status (for the timeline). Zero rows is ErrLeaseLost.
func (s *Store) fencedUpdate(ctx context.Context, tx pgx.Tx, opID int64, token, sql string, args ...any) (Operation, string, error) {
	var from string
	// Read the status under the row lock the UPDATE will take anyway.
	err := tx.QueryRow(ctx, `SELECT status FROM policy_operations WHERE id = $1 FOR UPDATE`, opID).Scan(&from)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, "", ErrOperationNotFound
	}
	if err != nil {
		return Operation{}, "", fmt.Errorf("policies: lock operation: %w", err)
	}
	op, err := scanOperation(tx.QueryRow(ctx, sql, append([]any{opID, token}, args...)...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, "", ErrLeaseLost
	}
	if err != nil {
		return Operation{}, "", fmt.Errorf("policies: update operation: %w", err)
	}
	return op, from, nil
}
