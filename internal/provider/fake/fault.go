package fake

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Mode is how the provider treats a cancellation call. See the table in doc.go.
type Mode string

// The fault modes. Every mode but ModeFlaky is concrete; ModeFlaky draws one
// of the others per call.
const (
	ModeOK           Mode = "ok"            // apply, answer 200 COMPLETED
	ModeReject       Mode = "reject"        // refuse, answer 422 REJECTED
	ModeError        Mode = "error"         // record nothing, answer 503
	ModeDrop         Mode = "drop"          // record nothing, never answer
	ModeLostResponse Mode = "lost_response" // apply, never answer
	ModeSlow         Mode = "slow"          // accept as RUNNING, answer only once complete
	ModeFlaky        Mode = "flaky"         // a seeded, weighted draw of the modes above
)

// concreteModes lists the modes a flaky draw can land on, in the fixed order
// the draw walks them (a map's order would make the draw nondeterministic).
var concreteModes = []Mode{ModeOK, ModeReject, ModeError, ModeDrop, ModeLostResponse, ModeSlow}

func (m Mode) valid() bool { return m == ModeFlaky || m.concrete() }

func (m Mode) concrete() bool {
	for _, c := range concreteModes {
		if m == c {
			return true
		}
	}
	return false
}

// StatusMode is how the provider treats a status query, independently of
// cancellations, so "the truth cannot be learned right now" can be staged.
type StatusMode string

// The status-query fault modes.
const (
	StatusOK    StatusMode = "ok"    // answer the truth
	StatusError StatusMode = "error" // answer 503
	StatusDrop  StatusMode = "drop"  // never answer
)

// Weights give each concrete mode's share of flaky draws: {"ok": 4,
// "error": 1} makes four calls in five succeed, on average.
type Weights map[Mode]int

// DefaultWeights is the flaky mix a provider starts with: mostly fine,
// with every kind of timeout represented.
func DefaultWeights() Weights {
	return Weights{ModeOK: 4, ModeReject: 0, ModeError: 2, ModeDrop: 1, ModeLostResponse: 2, ModeSlow: 1}
}

// draw returns the concrete mode of the n-th draw under seed. It is a pure
// function of (seed, n, weights): replaying a seed replays the outcomes.
func (w Weights) draw(seed, n int64) Mode {
	total := 0
	for _, m := range concreteModes {
		total += w[m]
	}
	x := rand.New(rand.NewPCG(uint64(seed), uint64(n))).IntN(total)
	for _, m := range concreteModes {
		if x < w[m] {
			return m
		}
		x -= w[m]
	}
	panic("fake: weights changed during a draw") // unreachable: x < total
}

// Fault is one fault setting, the JSON of GET and PUT /v1/faults:
//
//	{"mode":"lost_response","idempotent":true,"slow_ms":5000,"policy_id":null,"next":0,
//	 "latency_ms":0,"status_mode":"ok","seed":1,"weights":{"ok":4,"error":2,…}}
//
// Fields left out of a PUT take their DefaultFault values.
type Fault struct {
	Mode Mode `json:"mode"`
	// Idempotent: a repeated key applies nothing new and gets the first
	// outcome. False: a repeat is processed again and applies a second effect.
	Idempotent bool `json:"idempotent"`
	// SlowMS is how long a slow call stays RUNNING.
	SlowMS int `json:"slow_ms"`
	// PolicyID scopes the fault: nil is the global default, a number
	// overrides it for that policy's calls.
	PolicyID *int64 `json:"policy_id"`
	// Next > 0 makes the fault a script entry that applies to the next Next
	// matching calls only, after the entries queued before it.
	Next int `json:"next"`
	// LatencyMS delays every answer (status queries too, for the global fault).
	LatencyMS int `json:"latency_ms"`
	// StatusMode is how status queries fail. It is provider-wide: only the
	// global fault carries it.
	StatusMode StatusMode `json:"status_mode,omitempty"`
	// Seed and Weights drive ModeFlaky.
	Seed    int64   `json:"seed"`
	Weights Weights `json:"weights"`
}

// DefaultFault is a healthy, idempotent provider (the migration seeds the
// same values, and Reset restores them).
func DefaultFault() Fault {
	return Fault{
		Mode:       ModeOK,
		Idempotent: true,
		SlowMS:     5000,
		StatusMode: StatusOK,
		Seed:       1,
		Weights:    DefaultWeights(),
	}
}

// UnmarshalJSON decodes a Fault over DefaultFault, so {"mode":"drop"} means
// an idempotent provider that drops, not a zero-valued non-idempotent one.
func (f *Fault) UnmarshalJSON(b []byte) error {
	type plain Fault // no methods: no recursion
	v := plain(DefaultFault())
	v.Weights = nil // a given weights object replaces the defaults instead of merging into them
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.Weights == nil {
		v.Weights = DefaultWeights()
	}
	*f = Fault(v)
	return nil
}

// Config is the whole fault configuration, the answer of GET /v1/faults. A
// call is governed by the first script entry that matches it, else by its
// policy's override, else by the global fault.
type Config struct {
	Global    Fault   `json:"global"`
	Overrides []Fault `json:"overrides"`
	// Script lists the queued entries in the order they will be used; Next
	// is how many calls each still applies to.
	Script []Fault `json:"script"`
}

// ErrInvalidFault reports a fault setting the provider refuses.
var ErrInvalidFault = errors.New("fake: invalid fault")

// Limits keep a typo from holding connections for a day.
const (
	maxSlow    = 10 * time.Minute
	maxLatency = time.Minute
	maxNext    = 10000
)

func (f Fault) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidFault}, args...)...)
	}
	switch {
	case !f.Mode.valid():
		return bad("mode %q (want ok, reject, error, drop, lost_response, slow or flaky)", f.Mode)
	case f.SlowMS < 0 || time.Duration(f.SlowMS)*time.Millisecond > maxSlow:
		return bad("slow_ms %d (want 0 to %d)", f.SlowMS, maxSlow.Milliseconds())
	case f.LatencyMS < 0 || time.Duration(f.LatencyMS)*time.Millisecond > maxLatency:
		return bad("latency_ms %d (want 0 to %d)", f.LatencyMS, maxLatency.Milliseconds())
	case f.Next < 0 || f.Next > maxNext:
		return bad("next %d (want 0 to %d)", f.Next, maxNext)
	case f.PolicyID != nil && *f.PolicyID <= 0:
		return bad("policy_id %d (want a positive id or null)", *f.PolicyID)
	}
	switch f.StatusMode {
	case StatusOK, StatusError, StatusDrop:
	default:
		return bad("status_mode %q (want ok, error or drop)", f.StatusMode)
	}
	if f.StatusMode != StatusOK && (f.PolicyID != nil || f.Next > 0) {
		return bad("status_mode is provider-wide: set it on the global fault (policy_id null, next 0)")
	}
	total := 0
	for m, w := range f.Weights {
		if !m.concrete() {
			return bad("weights: %q is not a concrete mode", m)
		}
		if w < 0 {
			return bad("weights: %q is negative", m)
		}
		total += w
	}
	if total == 0 {
		return bad("weights: at least one mode needs a positive weight")
	}
	return nil
}

// callFault is the fault that governs one cancellation call, with flaky
// already resolved to a concrete mode.
type callFault struct {
	mode       Mode
	idempotent bool
	slow       time.Duration
	latency    time.Duration
}
