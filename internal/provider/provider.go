package provider

import (
	"context"
	"errors"
	"fmt"
)

// Client is what idemlab needs from the provider. HTTPClient implements it;
// tests may substitute their own.
type Client interface {
	// Cancel asks the provider to cancel a policy under req.Key. See Result
	// for how to read the answer. A non-nil error means no request was sent
	// (invalid arguments or a context already done): nothing was applied.
	Cancel(ctx context.Context, req CancelRequest) (Result, error)

	// Status reports the provider's truth for key. An error wrapping
	// ErrUnreachable means the truth cannot be learned right now — it is
	// never reported as TruthNotStarted.
	Status(ctx context.Context, key string) (Truth, error)
}

// CancelRequest is one cancellation call.
type CancelRequest struct {
	// Key is the provider idempotency key: one per operation, the same for
	// every retry of it. 1 to 255 visible ASCII characters.
	Key      string
	PolicyID int64
	Reason   string
}

// Truth is the provider's own record of a key.
type Truth string

// The truths a key can have. A key moves NOT_STARTED → RUNNING → COMPLETED,
// or NOT_STARTED → REJECTED, and never back.
const (
	TruthNotStarted Truth = "NOT_STARTED" // the provider has no record of the key
	TruthRunning    Truth = "RUNNING"     // accepted, not finished yet
	TruthCompleted  Truth = "COMPLETED"   // the cancellation took effect
	TruthRejected   Truth = "REJECTED"    // refused for a business reason; nothing applied
)

// Valid reports whether t is one of the four truths.
func (t Truth) Valid() bool {
	switch t {
	case TruthNotStarted, TruthRunning, TruthCompleted, TruthRejected:
		return true
	}
	return false
}

// Outcome classifies a Cancel call so the caller decides without guessing.
type Outcome int

// The zero Outcome is Unknown: a Result nobody filled in means "we do not
// know", which is the only safe default.
const (
	Unknown   Outcome = iota // may or may not have been applied: ask Status later
	Confirmed                // the provider says the cancellation is done
	Rejected                 // the provider refused for a business reason: nothing applied
)

func (o Outcome) String() string {
	switch o {
	case Confirmed:
		return "confirmed"
	case Rejected:
		return "rejected"
	default:
		return "unknown"
	}
}

// Result is the classified answer to Cancel.
type Result struct {
	Outcome Outcome
	// Truth is what the provider said about the key when it said anything:
	// TruthCompleted with Confirmed, TruthRejected with Rejected, TruthRunning
	// with an Unknown "accepted, still running". Empty when no answer arrived.
	Truth Truth
	// Reason is the provider's explanation of a refusal.
	Reason string
	// Err is why the outcome is Unknown: a timeout (errors.Is
	// context.DeadlineExceeded), a network error, or a *StatusError. Nil
	// otherwise.
	Err error
}

// ErrUnreachable reports that the provider's truth cannot be learned right
// now (timeout, connection failure, 5xx, an answer that makes no sense). The
// cause is wrapped alongside it.
var ErrUnreachable = errors.New("provider: unreachable")

// ErrInvalidRequest reports arguments the client refuses to send.
var ErrInvalidRequest = errors.New("provider: invalid request")

// StatusError is an HTTP answer the client did not expect. It makes a Cancel
// outcome Unknown and a Status call unreachable: an answer we cannot read is
// no information.
type StatusError struct {
	StatusCode int
	Body       string // the start of the body, for logs
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("provider: unexpected HTTP status %d: %s", e.StatusCode, e.Body)
}

// ValidKey reports whether key is a well-formed provider idempotency key: 1 to
// 255 visible ASCII characters, so it travels in a header and a URL path
// unchanged.
func ValidKey(key string) bool {
	if len(key) == 0 || len(key) > 255 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] > '~' {
			return false
		}
	}
	return true
}
