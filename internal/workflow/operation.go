package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/external"
)

// Operation statuses. IN_PROGRESS and RECOVERING are ownership states, not
// answers: someone holds the operation under a lease and the truth of its
// current step is not known yet. The other three are terminal as far as the
// workflow goes (NEEDS_RECONCILIATION waits for a person, and is asked again
// now and then: see Engine.Recover).
const (
	StatusInProgress          = "IN_PROGRESS"
	StatusRecovering          = "RECOVERING"
	StatusSucceeded           = "SUCCEEDED"
	StatusFailed              = "FAILED"
	StatusNeedsReconciliation = "NEEDS_RECONCILIATION"
)

// Statuses lists them, live ones first.
var Statuses = []string{StatusInProgress, StatusRecovering, StatusSucceeded, StatusFailed, StatusNeedsReconciliation}

// Step states. PENDING: not reached yet. SENT: an external call is recorded,
// with its deadline, and may be on its way. DONE and FAILED: the outcome is
// known. UNKNOWN: a call was made and its outcome is not known.
const (
	StepPending = "PENDING"
	StepSent    = "SENT"
	StepDone    = "DONE"
	StepFailed  = "FAILED"
	StepUnknown = "UNKNOWN"
	// StepCancelled: never run, because the operation was cancelled
	// before it (cancel.go). It was never sent: no call of it can exist.
	StepCancelled = "CANCELLED"
)

// Why a live operation's lease ended early (operations.released).
const (
	ReleasedHandedOver     = "handed_over"     // its owner met an unknown outcome and gave it to recovery
	ReleasedBackedOff      = "backed_off"      // an attempt learned nothing; claimable at next_attempt_at
	ReleasedRetryRequested = "retry_requested" // a person asked for another try
)

var (
	// ErrLeaseLost: the caller no longer owns the operation (its lease ran
	// out and someone else took over, or it is already finished). The
	// transaction that got it rolls back; the refusal is counted.
	ErrLeaseLost = errors.New("workflow: lease lost: another worker owns the operation now")
	// ErrNotFound is returned for an unknown operation and for another
	// customer's operation alike.
	ErrNotFound = errors.New("workflow: operation not found")
)

// Operation is one business intent and everything known about it. Steps
// are those of its current run, in order.
type Operation struct {
	ID             int64      `json:"id"`
	Type           string     `json:"operation_type"`
	PolicyID       int64      `json:"policy_id,omitempty"`
	BookingID      int64      `json:"booking_id,omitempty"`
	UserID         int64      `json:"user_id"`
	IdempotencyKey string     `json:"idempotency_key"`
	Reason         string     `json:"reason"`
	Status         string     `json:"status"`
	OwnerToken     *string    `json:"owner_token"`
	OwnerID        *string    `json:"owner_id"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	Released       *string    `json:"released"`
	Run            int        `json:"run"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	LastError      *string    `json:"last_error"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	FinishedAt     *time.Time `json:"finished_at"`
	// CancelRequestedAt is when a person asked to cancel the operation
	// (cancel.go), and CancelRequestedBy who; nil: nobody has.
	CancelRequestedAt *time.Time   `json:"cancel_requested_at"`
	CancelRequestedBy *string      `json:"cancel_requested_by"`
	Steps             []StepRecord `json:"steps"`
}

// Terminal reports whether nothing more will happen to op on its own.
func (op Operation) Terminal() bool {
	return op.Status == StatusSucceeded || op.Status == StatusFailed || op.Status == StatusNeedsReconciliation
}

// Subject names what op acts on, as the admin's lists show it: "policy 3",
// or "booking 7" for the deposit saga.
func (op Operation) Subject() string {
	if op.BookingID != 0 {
		return "booking " + strconv.FormatInt(op.BookingID, 10)
	}
	return "policy " + strconv.FormatInt(op.PolicyID, 10)
}

// Step returns the step called name in op's current run.
func (op Operation) Step(name string) (StepRecord, bool) {
	for _, s := range op.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return StepRecord{}, false
}

// Stuck is the first step not DONE: the one a person decides about when
// the operation waits for them (false when every step is done).
func (op Operation) Stuck() (StepRecord, bool) {
	if i := op.current(); i < len(op.Steps) {
		return op.Steps[i], true
	}
	return StepRecord{}, false
}

// current is the index of the first step not DONE (len(Steps) when all
// are). A CANCELLED step is passed over: after it come the compensations.
func (op Operation) current() int {
	for i, s := range op.Steps {
		if s.State != StepDone && s.State != StepCancelled {
			return i
		}
	}
	return len(op.Steps)
}

// cancelled reports whether the operation stopped for a cancel and is
// compensating (a step of its run is CANCELLED): its end is FAILED, not
// SUCCEEDED, once the compensations are done.
func (op Operation) cancelled() bool {
	for _, s := range op.Steps {
		if s.State == StepCancelled {
			return true
		}
	}
	return false
}

// StepRecord is one step of one run, as the database has it.
type StepRecord struct {
	Position   int             `json:"position"`
	Name       string          `json:"name"`
	Key        string          `json:"key"`
	System     *string         `json:"system"` // nil: a local step
	State      string          `json:"state"`
	Attempts   int             `json:"attempts"`
	DeadlineAt *time.Time      `json:"deadline_at"`
	SentAt     *time.Time      `json:"sent_at"`
	FinishedAt *time.Time      `json:"finished_at"`
	Request    json.RawMessage `json:"request"`
	Answer     json.RawMessage `json:"answer"`
	Truth      *string         `json:"truth"`
	UpdatedAt  time.Time       `json:"updated_at"`
	// CarriedFromRun: the step was done in that earlier run and carried
	// into this one by a retry from a later step (retry.go), under the key
	// it was done with; nil: this run does it.
	CarriedFromRun *int `json:"carried_from_run"`
	// Traceparent is the W3C trace context of the span that last sent the
	// step (the request's, or recovery's): recovery continues that trace.
	Traceparent *string `json:"traceparent"`
}

// lastTrace is the traceparent of the step sent last ("" when no step
// has been sent, or none in a trace).
func (op Operation) lastTrace() string {
	var last StepRecord
	for _, s := range op.Steps {
		if s.Traceparent != nil && s.SentAt != nil && (last.SentAt == nil || s.SentAt.After(*last.SentAt)) {
			last = s
		}
	}
	if last.Traceparent == nil {
		return ""
	}
	return *last.Traceparent
}

// External reports whether the step calls another system.
func (s StepRecord) External() bool { return s.System != nil }

// StepKey is the idempotency key of a step's call: {operation}:{step}, plus
// :{run} once a FAILED operation has been started again. It is derived from
// what the step is, never from a random value or a position in a list, so
// every retry — by the request, after a crash, after a restart, by the
// recovery loop on another instance — sends the same call.
func StepKey(operationID int64, step string, run int) string {
	if run <= 1 {
		return fmt.Sprintf("%d:%s", operationID, step)
	}
	return fmt.Sprintf("%d:%s:%d", operationID, step, run)
}

// operationOfKey is the operation a step key belongs to — its leading
// number (false for a key StepKey did not make). The key is found among
// that operation's steps: operation_steps is keyed by operation, and its
// check (operation_steps_key_check) holds every key to StepKey's form.
func operationOfKey(key string) (int64, bool) {
	head, _, ok := strings.Cut(key, ":")
	if !ok {
		return 0, false
	}
	id, err := strconv.ParseInt(head, 10, 64)
	return id, err == nil && id > 0
}

// OperationColumns is the select list ScanOperation reads, in order: the
// engine's, and other packages' reads that join operations to their own
// tables (a policy's page).
const OperationColumns = `id, operation_type, coalesce(policy_id, 0), coalesce(booking_id, 0), user_id, idempotency_key,
	reason, status, owner_token::text, owner_id, lease_expires_at, released, run, attempts, next_attempt_at,
	last_error, created_at, updated_at, finished_at, cancel_requested_at, cancel_requested_by`

// ScanOperation reads OperationColumns from row, after prefix.
func ScanOperation(row pgx.Row, prefix ...any) (Operation, error) {
	var op Operation
	err := row.Scan(append(prefix, &op.ID, &op.Type, &op.PolicyID, &op.BookingID, &op.UserID, &op.IdempotencyKey,
		&op.Reason, &op.Status, &op.OwnerToken, &op.OwnerID, &op.LeaseExpiresAt, &op.Released, &op.Run, &op.Attempts,
		&op.NextAttemptAt, &op.LastError, &op.CreatedAt, &op.UpdatedAt, &op.FinishedAt, &op.CancelRequestedAt,
		&op.CancelRequestedBy)...)
	return op, err
}

// stepColumns is the select list scanStep reads, in order.
const stepColumns = `position, name, step_key, system, state, attempts, deadline_at, sent_at, finished_at,
	request, answer, truth, updated_at, carried_from_run, traceparent`

func scanStep(row pgx.Row) (StepRecord, error) {
	var s StepRecord
	err := row.Scan(stepDest(&s)...)
	return s, err
}

func stepDest(s *StepRecord) []any {
	return []any{&s.Position, &s.Name, &s.Key, &s.System, &s.State, &s.Attempts, &s.DeadlineAt, &s.SentAt,
		&s.FinishedAt, &s.Request, &s.Answer, &s.Truth, &s.UpdatedAt, &s.CarriedFromRun, &s.Traceparent}
}

func ptr[T any](v T) *T { return &v }

// nullTruth is t as a column: NULL for none.
func nullTruth(t external.Truth) *string {
	if t == "" {
		return nil
	}
	return ptr(string(t))
}

// sqlRestart starts a FAILED operation again as its next run. A new run
// lays out new step keys, so every external call of the run is a new call
// to its system, never a retry of the refused one.
const sqlRestart = `
UPDATE operations
   SET status = 'IN_PROGRESS',
       run = run + 1,
       idempotency_key = $2,
       reason = coalesce($5, reason), -- NULL: the operation keeps its reason
       owner_token = gen_random_uuid(),
       owner_id = $3,
       lease_expires_at = now() + make_interval(secs => $4),
       released = NULL,
       attempts = 0,
       next_attempt_at = NULL,
       last_error = NULL,
       finished_at = NULL,
       cancel_requested_at = NULL, -- a new run is not the cancelled one
       cancel_requested_by = NULL,
       updated_at = now()
 WHERE id = $1
   AND status = 'FAILED' -- 0 rows: someone restarted it first
RETURNING ` + OperationColumns

// Restart starts the FAILED operation id again in tx, as its next run, owned
// by owner under a lease and answering requestKey; reason, when not nil,
// replaces the operation's. ok is false when the operation was no longer
// FAILED: another request restarted it first.
func Restart(ctx context.Context, tx pgx.Tx, id int64, requestKey string, reason *string, owner Owner) (op Operation, ok bool, err error) {
	op, err = ScanOperation(tx.QueryRow(ctx, sqlRestart, id, requestKey, owner.ID, owner.Lease.Seconds(), reason))
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, false, nil
	}
	if err != nil {
		return Operation{}, false, fmt.Errorf("workflow: restart operation %d: %w", id, err)
	}
	return op, true, nil
}

// Owner identifies who is acting: a request or a recovery worker.
type Owner struct {
	// ID says who, for people: "request 3f2c… on app-1", "recovery on app-2".
	ID string
	// Lease is how long the owner may act before others may take over.
	Lease time.Duration
}
