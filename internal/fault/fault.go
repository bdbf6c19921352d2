package fault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Mode is how a fake treats a mutating call. See the table in doc.go.
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

// StatusMode is how a fake treats a status query, independently of the
// mutating calls, so "the truth cannot be learned right now" can be staged.
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

// DefaultWeights is the flaky mix a fake starts with: mostly fine, with
// every kind of timeout represented.
func DefaultWeights() Weights {
	return Weights{ModeOK: 4, ModeReject: 0, ModeError: 2, ModeDrop: 1, ModeLostResponse: 2, ModeSlow: 1}
}

// draw returns the concrete mode of the n-th draw under seed. It is a pure
// function of (seed, n, weights): replaying a seed replays the outcomes.
// Validated weights are bounded and sum to at least 1, so IntN's argument
// is always positive.
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
	panic("fault: weights changed during a draw") // unreachable: x < total
}

// Subject is what a call is about, as a fake knows it: "policy:7",
// "booking:3". Faults can be scoped to one subject.
type Subject string

// Policy is the subject of a call about policy id.
func Policy(id int64) Subject { return Subject("policy:" + strconv.FormatInt(id, 10)) }

// Booking is the subject of a call about booking id.
func Booking(id int64) Subject { return Subject("booking:" + strconv.FormatInt(id, 10)) }

// kind returns "policy" or "booking".
func (s Subject) kind() string { k, _, _ := strings.Cut(string(s), ":"); return k }

// ids returns the policy or booking id s names (nil, nil for none).
func (s Subject) ids() (policyID, bookingID *int64) {
	kind, raw, ok := strings.Cut(string(s), ":")
	id, err := strconv.ParseInt(raw, 10, 64)
	if !ok || err != nil {
		return nil, nil
	}
	switch kind {
	case "policy":
		return &id, nil
	case "booking":
		return nil, &id
	}
	return nil, nil
}

// Fault is one fault setting, the JSON of GET and PUT /v1/faults on every fake:
//
//	{"mode":"lost_response","idempotent":true,"slow_ms":5000,"policy_id":null,"next":0,
//	 "latency_ms":0,"status_mode":"ok","seed":1,"weights":{"ok":4,"error":2,…}}
//
// Fields left out take their Default values; unknown fields are refused.
type Fault struct {
	Mode Mode `json:"mode"`
	// Idempotent: a repeated key applies nothing new and gets the first
	// outcome. False: a repeat is processed again and applies a second effect.
	Idempotent bool `json:"idempotent"`
	// SlowMS is how long a slow call stays RUNNING.
	SlowMS int `json:"slow_ms"`
	// PolicyID or BookingID scopes the fault to that subject's calls; both
	// nil is the global default. A fake accepts the kinds it knows (the
	// provider: policies; payments: policies and bookings).
	PolicyID  *int64 `json:"policy_id"`
	BookingID *int64 `json:"booking_id,omitempty"`
	// Next > 0 makes the fault a script entry that applies to the next Next
	// matching calls only, after the entries queued before it.
	Next int `json:"next"`
	// LatencyMS delays every answer (status queries too, for the global fault).
	LatencyMS int `json:"latency_ms"`
	// StatusMode is how status queries fail. It is fake-wide: only the
	// global fault carries it.
	StatusMode StatusMode `json:"status_mode,omitempty"`
	// Seed and Weights drive ModeFlaky.
	Seed    int64   `json:"seed"`
	Weights Weights `json:"weights"`
}

// Default is a healthy, idempotent fake (the migration seeds the same
// values, and a reset restores them).
func Default() Fault {
	return Fault{
		Mode:       ModeOK,
		Idempotent: true,
		SlowMS:     5000,
		StatusMode: StatusOK,
		Seed:       1,
		Weights:    DefaultWeights(),
	}
}

// subject is the subject f is scoped to, "" for the global fault.
func (f Fault) subject() Subject {
	switch {
	case f.PolicyID != nil:
		return Policy(*f.PolicyID)
	case f.BookingID != nil:
		return Booking(*f.BookingID)
	}
	return ""
}

// UnmarshalJSON decodes a Fault over Default, so {"mode":"drop"} means an
// idempotent fake that drops, not a zero-valued non-idempotent one. It
// refuses unknown fields and trailing data (a plain syntax error), and
// reports a number too large for its field as an *InvalidError naming it.
func (f *Fault) UnmarshalJSON(b []byte) error {
	type plain Fault // no methods: no recursion
	v := plain(Default())
	v.Weights = nil // a given weights object replaces the defaults instead of merging into them
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return errors.New("fault: one JSON object expected")
	}
	if v.Weights == nil {
		v.Weights = DefaultWeights()
	}
	*f = Fault(v)
	return nil
}

// decodeError turns a number that does not fit its field (an int of 30
// digits) into an InvalidError naming the field: the value is out of range,
// the JSON is fine. Every other error stays a decoding error.
func decodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && strings.HasPrefix(te.Value, "number") {
		switch te.Type.Kind() {
		case reflect.Int, reflect.Int64:
			field := te.Field
			if strings.HasPrefix(field, "weights") {
				field = "weights"
			}
			return &InvalidError{Field: field, Message: "the number is out of range"}
		}
	}
	return err
}

// Config is a fake's whole fault configuration, the answer of GET
// /v1/faults. A call is governed by the first script entry that matches it,
// else by its subject's override, else by the global fault.
type Config struct {
	Global    Fault   `json:"global"`
	Overrides []Fault `json:"overrides"`
	// Script lists the queued entries in the order they will be used; Next
	// is how many calls each still applies to.
	Script []Fault `json:"script"`
}

// ErrInvalidFault reports a fault setting a fake refuses.
var ErrInvalidFault = errors.New("fault: invalid fault")

// InvalidError is a refused fault setting: which field, and why. It wraps
// ErrInvalidFault. The fakes answer it as 422 {"error":"invalid_fault",
// "field", "message"}.
type InvalidError struct {
	Field   string // the JSON name: "slow_ms", "weights.ok", "weights"
	Message string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrInvalidFault, e.Field, e.Message)
}

func (e *InvalidError) Unwrap() error { return ErrInvalidFault }

// Bounds. Every number a fault carries is bounded, so a typo cannot hold
// connections for a day, overflow a sum, or reach a JSON reader that cannot
// represent it (2^53 - 1 is the largest integer every JSON reader keeps).
const (
	MaxSlowMS    = int(10 * time.Minute / time.Millisecond)
	MaxLatencyMS = int(time.Minute / time.Millisecond)
	MaxNext      = 10_000
	MaxWeight    = 1_000
	MaxSeed      = 1<<53 - 1
	MaxID        = 1<<53 - 1
)

// withDefaults fills what Set fills: nil Weights and an empty StatusMode.
func (f Fault) withDefaults() Fault {
	if f.Weights == nil {
		f.Weights = DefaultWeights()
	}
	if f.StatusMode == "" {
		f.StatusMode = StatusOK
	}
	return f
}

// Validate checks f as system's fake will (kinds: the subject kinds it
// scopes faults by, "policy", "booking"), so a caller refuses a bad fault at
// its own edge — 422 with the field — instead of forwarding it to be
// refused, or not understood, at the fake's.
func (f Fault) Validate(system string, kinds ...string) error {
	return f.withDefaults().validate(system, kinds)
}

// clip shortens a value echoed in a refusal: a 900 KB mode is named by its
// first characters.
func clip[S ~string](s S) string {
	if len(s) <= 40 {
		return string(s)
	}
	return strings.ToValidUTF8(string(s[:40]), "") + "…"
}

// validate checks f for the fake system, which knows the subject kinds in kinds.
func (f Fault) validate(system string, kinds []string) error {
	bad := func(field, format string, args ...any) error {
		return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case !f.Mode.valid():
		return bad("mode", "mode %q (want ok, reject, error, drop, lost_response, slow or flaky)", clip(f.Mode))
	case f.SlowMS < 0 || f.SlowMS > MaxSlowMS:
		return bad("slow_ms", "slow_ms %d is out of range (0 to %d)", f.SlowMS, MaxSlowMS)
	case f.LatencyMS < 0 || f.LatencyMS > MaxLatencyMS:
		return bad("latency_ms", "latency_ms %d is out of range (0 to %d)", f.LatencyMS, MaxLatencyMS)
	case f.Next < 0 || f.Next > MaxNext:
		return bad("next", "next %d is out of range (0 to %d)", f.Next, MaxNext)
	case f.Seed < 0 || f.Seed > MaxSeed:
		return bad("seed", "seed %d is out of range (0 to %d)", f.Seed, int64(MaxSeed))
	case f.PolicyID != nil && (*f.PolicyID <= 0 || *f.PolicyID > MaxID):
		return bad("policy_id", "policy_id %d is out of range (a positive id up to %d, or null)", *f.PolicyID, int64(MaxID))
	case f.BookingID != nil && (*f.BookingID <= 0 || *f.BookingID > MaxID):
		return bad("booking_id", "booking_id %d is out of range (a positive id up to %d, or null)", *f.BookingID, int64(MaxID))
	case f.PolicyID != nil && f.BookingID != nil:
		return bad("booking_id", "a fault is scoped to a policy or a booking, not both")
	}
	if s := f.subject(); s != "" && !contains(kinds, s.kind()) {
		return bad(s.kind()+"_id", "this system knows no %ss (it scopes faults by %s)", s.kind(), strings.Join(kinds, " or "))
	}
	switch f.StatusMode {
	case StatusOK, StatusError, StatusDrop:
	default:
		return bad("status_mode", "status_mode %q (want ok, error or drop)", clip(f.StatusMode))
	}
	if f.StatusMode != StatusOK && (f.subject() != "" || f.Next > 0) {
		return bad("status_mode", "status_mode is %s-wide: set it on the global fault (no subject, next 0)", system)
	}
	for m := range f.Weights {
		if !m.concrete() {
			return bad("weights", "weights: %q is not a concrete mode", clip(m))
		}
	}
	total := 0
	for _, m := range concreteModes { // a fixed order: the same refusal every time
		w := f.Weights[m]
		if w < 0 || w > MaxWeight {
			return bad("weights."+string(m), "weight %d is out of range (0 to %d)", w, MaxWeight)
		}
		total += w // at most 6 × MaxWeight: no overflow
	}
	if total == 0 {
		return bad("weights", "weights sum to 0: at least one mode needs a positive weight")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Call is the fault that governs one mutating call, with flaky already
// drawn down to a concrete mode.
type Call struct {
	Mode       Mode
	Idempotent bool
	Slow       time.Duration // how long a slow call stays RUNNING
	Latency    time.Duration // how long every answer is delayed
}

// Accepted reports whether the call's mode carries out the effect (now, or
// after Slow); reject refuses it, and error and drop never let it in.
func (c Call) Accepted() bool {
	switch c.Mode {
	case ModeOK, ModeLostResponse, ModeSlow:
		return true
	}
	return false
}

// CompletesIn is how long after receipt an accepted call completes.
func (c Call) CompletesIn() time.Duration {
	if c.Mode == ModeSlow {
		return c.Slow
	}
	return 0
}
