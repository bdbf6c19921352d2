package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Operation statuses. IN_PROGRESS and RECOVERING are ownership states, not
// answers: someone holds the operation under a lease and the remote truth
// is not known yet. The other three are terminal.
const (
	OpInProgress          = "IN_PROGRESS"
	OpRecovering          = "RECOVERING"
	OpSucceeded           = "SUCCEEDED"
	OpFailed              = "FAILED"
	OpNeedsReconciliation = "NEEDS_RECONCILIATION"
)

// OperationCancel is the only operation type so far.
const OperationCancel = "CANCEL"

// Step names and states recorded in an operation's steps, so a reader (and
// the operation page) sees how far the workflow got.
const (
	StepRecordIntent   = "record_intent"
	StepProviderCancel = "provider_cancel"
	StepMarkCancelled  = "mark_cancelled"

	StepPending = "PENDING"
	StepDone    = "DONE"
	StepUnknown = "UNKNOWN"
	StepFailed  = "FAILED"
)

var (
	// ErrDuplicateIntent: this policy already has a cancellation that is not
	// FAILED. Returned as a *DuplicateIntentError naming it.
	ErrDuplicateIntent = errors.New("policies: the policy already has a cancellation")
	// ErrLeaseLost: the caller no longer owns the operation (its lease ran
	// out and someone else took over, or it is already finished). The
	// transaction that got it must roll back.
	ErrLeaseLost = errors.New("policies: lease lost: another worker owns the operation now")
	// ErrOperationNotFound is returned for an unknown operation and for
	// another customer's operation alike.
	ErrOperationNotFound = errors.New("policies: operation not found")
)

// DuplicateIntentError names the operation that already expresses the intent.
type DuplicateIntentError struct {
	OperationID int64
	Status      string
	// SameRequest: the operation was started by this very request key — a
	// retry of a request whose process died before it could answer. It is
	// answered with the operation's state, not refused (see Canceller.Cancel).
	SameRequest bool
}

func (e *DuplicateIntentError) Error() string {
	return fmt.Sprintf("policies: the policy already has cancellation %d (%s)", e.OperationID, e.Status)
}

func (e *DuplicateIntentError) Unwrap() error { return ErrDuplicateIntent }

// Operation is one business intent on a policy and everything known about it.
type Operation struct {
	ID             int64             `json:"id"`
	PolicyID       int64             `json:"policy_id"`
	Type           string            `json:"operation_type"`
	UserID         int64             `json:"user_id"`
	IdempotencyKey string            `json:"idempotency_key"`
	Reason         string            `json:"reason"`
	Status         string            `json:"status"`
	OwnerToken     *string           `json:"owner_token"`
	OwnerID        *string           `json:"owner_id"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at"`
	Run            int               `json:"run"`
	ProviderKey    string            `json:"provider_key"`
	Attempts       int               `json:"attempts"`
	NextAttemptAt  *time.Time        `json:"next_attempt_at"`
	Steps          map[string]string `json:"steps"`
	ProviderTruth  *string           `json:"provider_truth"`
	LastError      *string           `json:"last_error"`
	CreatedAt      time.Time         `json:"created_at"`
	UpdatedAt      time.Time         `json:"updated_at"`
	FinishedAt     *time.Time        `json:"finished_at"`
}

// Terminal reports whether nothing more will happen to op on its own.
func (op Operation) Terminal() bool {
	return op.Status == OpSucceeded || op.Status == OpFailed || op.Status == OpNeedsReconciliation
}

// Event is one line of an operation's append-only timeline.
type Event struct {
	ID          int64     `json:"id"`
	OperationID int64     `json:"operation_id"`
	At          time.Time `json:"at"`
	FromStatus  *string   `json:"from_status"`
	ToStatus    string    `json:"to_status"`
	Actor       string    `json:"actor"`
	OwnerToken  *string   `json:"owner_token"`
	Detail      string    `json:"detail"`
	Statement   string    `json:"statement"`
	// Branch is the recovery decision-tree branch, for recovery events.
	Branch *string `json:"branch,omitempty"`
}

// opColumns is the select list scanOperation reads, in order.
const opColumns = `id, policy_id, operation_type, user_id, idempotency_key, reason, status,
	owner_token::text, owner_id, lease_expires_at, run, provider_key, attempts, next_attempt_at,
	steps, provider_truth, last_error, created_at, updated_at, finished_at`

func scanOperation(row pgx.Row) (Operation, error) {
	var op Operation
	err := row.Scan(&op.ID, &op.PolicyID, &op.Type, &op.UserID, &op.IdempotencyKey, &op.Reason, &op.Status,
		&op.OwnerToken, &op.OwnerID, &op.LeaseExpiresAt, &op.Run, &op.ProviderKey, &op.Attempts, &op.NextAttemptAt,
		&op.Steps, &op.ProviderTruth, &op.LastError, &op.CreatedAt, &op.UpdatedAt, &op.FinishedAt)
	return op, err
}

// GetOperation returns operation id if userID may see it (its owner, or
// anyone when asAdmin).
func (s *Store) GetOperation(ctx context.Context, id, userID int64, asAdmin bool) (Operation, error) {
	op, err := scanOperation(s.db.QueryRow(ctx, `
		SELECT `+opColumns+`
		  FROM policy_operations
		 WHERE id = $1
		   AND (user_id = $2 OR $3)`, id, userID, asAdmin))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrOperationNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: get operation: %w", err)
	}
	return op, nil
}

// OperationForPolicy returns the policy's cancellation, or
// ErrOperationNotFound when it has none.
func (s *Store) OperationForPolicy(ctx context.Context, policyID int64) (Operation, error) {
	op, err := scanOperation(s.db.QueryRow(ctx, `
		SELECT `+opColumns+`
		  FROM policy_operations
		 WHERE policy_id = $1
		   AND operation_type = 'CANCEL'`, policyID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, ErrOperationNotFound
	}
	if err != nil {
		return Operation{}, fmt.Errorf("policies: operation for policy: %w", err)
	}
	return op, nil
}

// Timeline returns the operation's events, oldest first.
func (s *Store) Timeline(ctx context.Context, operationID int64) ([]Event, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, operation_id, at, from_status, to_status, actor, owner_token::text, detail, statement, branch
		  FROM operation_events
		 WHERE operation_id = $1
		 ORDER BY id`, operationID)
	if err != nil {
		return nil, fmt.Errorf("policies: timeline: %w", err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Event])
	if err != nil {
		return nil, fmt.Errorf("policies: timeline: %w", err)
	}
	return events, nil
}

// recordEvent appends one line to the timeline, in the transaction that made
// the transition, so the timeline never shows a transition that rolled back.
func recordEvent(ctx context.Context, db database.DBTX, op Operation, from *string, actor, detail, statement string) error {
	return recordBranchEvent(ctx, db, op, from, actor, "", detail, statement)
}

// recordBranchEvent is recordEvent for the recovery loop, which also names
// the branch of the decision tree it took ("" for none).
func recordBranchEvent(ctx context.Context, db database.DBTX, op Operation, from *string, actor, branch, detail, statement string) error {
	_, err := db.Exec(ctx, `
		INSERT INTO operation_events (operation_id, from_status, to_status, actor, owner_token, detail, statement, branch)
		VALUES ($1, $2, $3, $4, $5::uuid, $6, $7, nullif($8, ''))`,
		op.ID, from, op.Status, actor, op.OwnerToken, detail, statement, branch)
	if err != nil {
		return fmt.Errorf("policies: record event: %w", err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
