package fake

import "github.com/idemlab/idemlab/internal/fault"

// The provider's faults are internal/fault's, shared with every other fake;
// these names keep the provider's callers reading fake.Fault, fake.ModeDrop.
// See the table in doc.go and docs/provider.md.
type (
	Mode       = fault.Mode
	StatusMode = fault.StatusMode
	Weights    = fault.Weights
	// Fault is one fault setting. The provider scopes faults by policy
	// (policy_id); a booking_id is refused.
	Fault  = fault.Fault
	Config = fault.Config
)

// The fault modes of cancellation calls.
const (
	ModeOK           = fault.ModeOK
	ModeReject       = fault.ModeReject
	ModeError        = fault.ModeError
	ModeDrop         = fault.ModeDrop
	ModeLostResponse = fault.ModeLostResponse
	ModeSlow         = fault.ModeSlow
	ModeFlaky        = fault.ModeFlaky
)

// The fault modes of status queries.
const (
	StatusOK    = fault.StatusOK
	StatusError = fault.StatusError
	StatusDrop  = fault.StatusDrop
)

// ErrInvalidFault reports a fault setting the provider refuses; the error is
// a *fault.InvalidError naming the field.
var ErrInvalidFault = fault.ErrInvalidFault

// DefaultFault is a healthy, idempotent provider (the migration seeds the
// same values, and Reset restores them).
func DefaultFault() Fault { return fault.Default() }

// DefaultWeights is the flaky mix a provider starts with.
func DefaultWeights() Weights { return fault.DefaultWeights() }
