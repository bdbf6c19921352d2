package provider

import (
	"context"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// Client is what idemlab needs from the provider. HTTPClient implements it;
// tests may substitute their own.
type Client interface {
	// Deadline is the deadline a call prepared now would carry. A caller
	// that records the deadline before the call takes it here and passes it
	// in CancelRequest.Deadline.
	Deadline() time.Time

	// Cancel asks the provider to cancel a policy under req.Key. See Result
	// for how to read the answer. A non-nil error means no request was sent
	// (invalid arguments, a context already done, a deadline already
	// passed): nothing was applied.
	Cancel(ctx context.Context, req CancelRequest) (Result, error)

	// Status reports the provider's truth for key. An error wrapping
	// ErrUnreachable means the truth cannot be learned right now — it is
	// never reported as TruthNotStarted. A NOT_STARTED answer is conclusive
	// only after the deadline of every call sent with the key has passed.
	Status(ctx context.Context, key string) (Truth, error)
}

// CancelRequest is one cancellation call.
type CancelRequest struct {
	// Key is the provider idempotency key: one per step, the same for
	// every retry of it. 1 to 255 visible ASCII characters.
	Key      string
	PolicyID int64
	Reason   string
	// Deadline is the latest moment the provider may apply the call (the
	// Request-Deadline header). Zero: Deadline(), now plus the timeout.
	Deadline time.Time
}

// The shared vocabulary of calls to another system, defined once in
// internal/external and named here so the provider's callers read
// provider.Result, provider.TruthCompleted … See that package's doc.
type (
	Truth       = external.Truth
	Outcome     = external.Outcome
	Result      = external.Result
	StatusError = external.StatusError
)

// The truths a key can have.
const (
	TruthNotStarted = external.TruthNotStarted
	TruthRunning    = external.TruthRunning
	TruthCompleted  = external.TruthCompleted
	TruthRejected   = external.TruthRejected
)

// The outcomes of a call; Unknown is the zero value.
const (
	Unknown   = external.Unknown
	Confirmed = external.Confirmed
	Rejected  = external.Rejected
)

// Errors, shared with every other system's client so one errors.Is serves all.
var (
	ErrUnreachable    = external.ErrUnreachable
	ErrInvalidRequest = external.ErrInvalidRequest
	ErrDeadlinePassed = external.ErrDeadlinePassed
)
