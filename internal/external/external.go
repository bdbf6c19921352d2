package external

import (
	"errors"
	"fmt"
	"time"
)

// Truth is another system's own record of an idempotency key.
type Truth string

// The truths a key can have. A key moves NOT_STARTED → RUNNING → COMPLETED,
// or NOT_STARTED → REJECTED, and never back.
const (
	TruthNotStarted Truth = "NOT_STARTED" // no call with the key has arrived (yet)
	TruthRunning    Truth = "RUNNING"     // accepted, not finished yet
	TruthCompleted  Truth = "COMPLETED"   // the effect took place
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

// Outcome classifies a call so the caller decides without guessing.
type Outcome int

// The zero Outcome is Unknown: a Result nobody filled in means "we do not
// know", which is the only safe default.
const (
	Unknown   Outcome = iota // may or may not have been applied: ask for the truth later
	Confirmed                // the system says the effect is done
	Rejected                 // the system refused for a business reason: nothing applied
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

// Result is the classified answer to a call that was sent.
type Result struct {
	Outcome Outcome
	// Truth is what the system said about the key when it said anything:
	// TruthCompleted with Confirmed, TruthRejected with Rejected, TruthRunning
	// with an Unknown "accepted, still running". Empty when no answer arrived.
	Truth Truth
	// Reason is the system's explanation of a refusal.
	Reason string
	// Err is why the outcome is Unknown: a timeout (errors.Is
	// context.DeadlineExceeded), a network error, or a *StatusError. Nil
	// otherwise.
	Err error
	// Deadline is the Request-Deadline the call carried: after it, the
	// system refuses the call, so a status of NOT_STARTED read after it
	// (plus a margin for clock skew) is conclusive.
	Deadline time.Time
}

// ErrUnreachable reports that a system's truth cannot be learned right now
// (timeout, connection failure, 5xx, an answer that makes no sense). The
// cause is wrapped alongside it.
var ErrUnreachable = errors.New("external: unreachable")

// ErrInvalidRequest reports arguments a client refuses to send.
var ErrInvalidRequest = errors.New("external: invalid request")

// ErrDeadlinePassed reports a call whose deadline had passed before it could
// be sent: nothing was sent, so nothing was applied.
var ErrDeadlinePassed = errors.New("external: deadline passed before sending")

// StatusError is an HTTP answer the client did not expect. It makes a call's
// outcome Unknown and a status query unreachable: an answer we cannot read
// is no information.
type StatusError struct {
	StatusCode int
	Body       string // the start of the body, for logs
	// Code is the system's error code ("error" in its JSON body), when it
	// gave one: "deadline_passed", "unavailable", "key_reused" …
	Code string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("unexpected HTTP status %d: %s", e.StatusCode, e.Body)
}

// ValidKey reports whether key is a well-formed idempotency key: 1 to 255
// visible ASCII characters, so it travels in a header and a URL path
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
