// Package history is what a chaos run remembers: every intent a client
// had, every attempt it made to get that intent answered, and every fault
// the nemesis injected — each with the moment it happened.
//
// The checks (package check) judge the run from this record and the end
// state alone, and the report draws it; neither looks at the processes.
// Keeping the record plain data (it is written out as JSON) means a check
// can be shown to fail on a history crafted by hand, and a surprising run
// can be studied after the fact.
package history

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Kinds of intent.
const (
	Cancel  = "cancel"  // cancel a policy
	Book    = "book"    // book a slot
	Release = "release" // release a booking this client made
	Stop    = "stop"    // an admin cancels a live operation a cancel intent left in progress (Parent)
)

// Intent is one thing a client wants done, sent under one Idempotency-Key
// until it gets a final answer.
type Intent struct {
	ID      int    `json:"id"`
	Client  int    `json:"client"`
	Kind    string `json:"kind"`
	User    string `json:"user"`
	Token   string `json:"token"`
	Key     string `json:"key"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Body    []byte `json:"body"`
	Subject int64  `json:"subject"` // the policy, slot or booking acted on
	// Parent is the intent this one follows from (a release: its booking).
	Parent   int       `json:"parent,omitempty"`
	Attempts []Attempt `json:"attempts"`
	// Abandoned is set when the run ended before the intent got a final
	// answer (the drain timed out).
	Abandoned bool `json:"abandoned,omitempty"`
}

// Attempt is one request of an intent and what came back.
type Attempt struct {
	Instance   string    `json:"instance"` // the app instance it was sent to
	Sent       time.Time `json:"sent"`
	Done       time.Time `json:"done"`
	Status     int       `json:"status"`            // 0: no answer
	Problem    string    `json:"problem,omitempty"` // problem+json type
	Replayed   bool      `json:"replayed,omitempty"`
	Body       []byte    `json:"body,omitempty"`
	RequestID  string    `json:"request_id,omitempty"`
	RetryAfter string    `json:"retry_after,omitempty"`
	Err        string    `json:"err,omitempty"` // why there was no answer
}

// Final reports whether the attempt is an answer the client may act on
// and stop retrying: any 2xx or 4xx except the ones that say "not yet"
// (409 request-in-progress), say nothing about the intent (401, 403: a
// valid token refused) or are the app's own bookkeeping (409 lease-lost).
// No answer, and every 5xx, mean: try again with the same key.
func (a Attempt) Final() bool {
	switch {
	case a.Status == 0 || a.Status >= 500:
		return false
	case a.Status == http.StatusConflict && (a.Problem == "request-in-progress" || a.Problem == "lease-lost"):
		return false
	case a.Status == http.StatusUnauthorized || a.Status == http.StatusForbidden:
		return false
	}
	return true
}

// Label names an answer in figures: "200", "409 slot-taken", "no answer: timeout".
func (a Attempt) Label() string {
	switch {
	case a.Status == 0:
		return "no answer: " + a.Err
	case a.Problem != "":
		return strconv.Itoa(a.Status) + " " + a.Problem
	default:
		return strconv.Itoa(a.Status)
	}
}

// FinalAnswer is the first final attempt, or nil.
func (in *Intent) FinalAnswer() *Attempt {
	for i := range in.Attempts {
		if in.Attempts[i].Final() {
			return &in.Attempts[i]
		}
	}
	return nil
}

// Fault kinds, as the report and the figures name them.
const (
	Kill      = "kill"          // SIGKILL at a random moment
	CrashKill = "crash-kill"    // died at an armed crash point
	Pause     = "pause"         // SIGSTOP … SIGCONT
	Delay     = "net-delay"     // the proxy delays traffic between app and a fake
	Hold      = "net-hold"      // the proxy holds the next calls past the client's timeout
	Flip      = "fault-flip"    // a fake's fault mode (and idempotency) changed
	Belief    = "belief"        // the app was told whether a fake is idempotent
	Callbacks = "callback-mode" // a fake's callback mode changed (ok, duplicate, delay, reorder, lost)
	Reorder   = "event-reorder" // the history consumer's next deliveries sent back: later events overtake them
	DBRestart = "db-restart"    // pg_ctl restart -m immediate
	DBDown    = "db-down"       // the database stopped for a while
	Failover  = "db-failover"   // the primary killed, its synchronous standby promoted
	Exit      = "exit"          // a process ended on its own: always a finding
	Heal      = "heal"          // every fault lifted
)

// Fault is one thing the nemesis did (or one process exit nobody caused).
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // = Start for instant faults
	Detail string    `json:"detail,omitempty"`
}

// Log is the whole record of a run. Its methods are safe for concurrent
// use; the exported fields are read once the run is over.
type Log struct {
	Seed    uint64     `json:"seed"`
	Started time.Time  `json:"started"`
	Healed  time.Time  `json:"healed"`
	Drained time.Time  `json:"drained"`
	Intents []*Intent  `json:"intents"`
	Faults  []Fault    `json:"faults"`
	Notes   []string   `json:"notes,omitempty"`
	mu      sync.Mutex `json:"-"`
}

// NewLog starts a record.
func NewLog(seed uint64) *Log { return &Log{Seed: seed, Started: time.Now()} }

// NewIntent registers an intent and gives it its id.
func (l *Log) NewIntent(in *Intent) *Intent {
	l.mu.Lock()
	defer l.mu.Unlock()
	in.ID = len(l.Intents) + 1
	l.Intents = append(l.Intents, in)
	return in
}

// Attempted appends an attempt to an intent.
func (l *Log) Attempted(in *Intent, a Attempt) {
	l.mu.Lock()
	in.Attempts = append(in.Attempts, a)
	l.mu.Unlock()
}

// Abandon marks an intent the run gave up on.
func (l *Log) Abandon(in *Intent) {
	l.mu.Lock()
	in.Abandoned = true
	l.mu.Unlock()
}

// Injected records a fault.
func (l *Log) Injected(f Fault) {
	if f.End.IsZero() {
		f.End = f.Start
	}
	l.mu.Lock()
	l.Faults = append(l.Faults, f)
	l.mu.Unlock()
}

// Note records a sentence for the report (a skipped fault, a fallback).
func (l *Log) Note(s string) {
	l.mu.Lock()
	l.Notes = append(l.Notes, s)
	l.mu.Unlock()
}

// Snapshot returns copies of the intents and faults so far, for a live
// progress line or the report, without holding the lock while reading.
func (l *Log) Snapshot() ([]Intent, []Fault) {
	l.mu.Lock()
	defer l.mu.Unlock()
	intents := make([]Intent, len(l.Intents))
	for i, in := range l.Intents {
		intents[i] = *in
		intents[i].Attempts = slices.Clone(in.Attempts)
	}
	return intents, slices.Clone(l.Faults)
}

// MarshalJSON writes the record under its lock.
func (l *Log) MarshalJSON() ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	type plain Log // without the method: no recursion
	return json.Marshal((*plain)(l))
}
