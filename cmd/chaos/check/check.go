// Package check judges a chaos run: from the clients' history and the
// state the system was left in once it had healed and drained, it lists
// every promise that was broken.
//
// The database's own view (GET /api/v1/invariants) is one witness. The
// clients are the other, and they see what the database cannot: an answer
// that was sent but never stored, two answers for one key, an answer that
// says "cancelled" for a policy that is not, a booking nobody was told
// about. Each check is a pure function of the history and the end state,
// so each one is shown to fail on a history crafted by hand (check_test.go).
//
// The checks:
//
//   - answered: every intent got a final answer (retrying with its key).
//   - agree: all final answers for one key are the same status and bytes.
//   - replay: after the drain, sending the request again replays — marked
//     Idempotent-Replayed — exactly what the client was first told.
//   - meaning: the answer's business meaning matches the end state (200 on
//     a cancellation: the policy is CANCELLED; 201 on a booking: the
//     booking exists and is the client's; …).
//   - orphans: every effect in the end state was answered to someone (no
//     booking or operation that no client heard of).
//   - no-500: no attempt was answered 500.
//   - own-answer: no request answered lease-lost or refused a valid token;
//     a request that lost its key answers what the key holds, or "in
//     progress".
//   - invariants: GET /api/v1/invariants found nothing.
//   - exits: no process ended on its own.
//   - last-resort: nothing waits for a person when the truth of the step
//     it is stuck at, asked after the drain, already settles it.
package check

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/internal/invariants"
)

// Violation is one broken promise.
type Violation struct {
	Check  string `json:"check"`
	Detail string `json:"detail"`
	Intent int    `json:"intent,omitempty"`
	Key    string `json:"key,omitempty"`
}

// EndState is what the system holds once healed and drained, read through
// its API (and, for the effects, the fakes' ledgers).
type EndState struct {
	Policies   map[int64]string    // policy id → ACTIVE | CANCELLED
	Operations map[int64]Operation // every operation an answer named
	Bookings   map[int64]Booking   // every booking of every customer
	// Replays is, per intent id, the answer to sending the intent's
	// request once more after the drain.
	Replays map[int]history.Attempt
	// Invariants is the app's own verdict.
	Invariants invariants.Report
	// Waiting are the operations in reconciliation, with the provider's
	// truth for each, asked after the drain.
	Waiting []Operation
	// Effects is the provider's effects ledger: policy → effects applied.
	Effects map[int64]int
	// Events is the outbox's overview: what was delivered and how many
	// repeats the broker and the consumers' inboxes caught.
	Events Events
	// Late counts the calls the provider refused for arriving after
	// their Request-Deadline (held calls, most of them).
	Late int64
}

// Events is GET /api/v1/events' overview, for the figures.
type Events struct {
	Transport        string `json:"transport"`
	Sent             int64  `json:"sent"`
	Pending          int64  `json:"pending"`
	Dead             int64  `json:"dead"`
	BrokerDuplicates int64  `json:"broker_duplicates"`
	Consumers        []struct {
		Consumer   string `json:"consumer"`
		Applied    int64  `json:"applied"`
		Duplicates int64  `json:"duplicates"`
	} `json:"consumers"`
	History struct {
		ParkedNow         int64 `json:"parked_now"`
		ParkedThenApplied int64 `json:"parked_then_applied"`
	} `json:"history"`
}

// Operation is an operation as GET /api/v1/operations/{id} shows it.
type Operation struct {
	ID       int64  `json:"id"`
	PolicyID int64  `json:"policy_id"`
	Status   string `json:"status"`
	Key      string `json:"idempotency_key"`
	// CancelRequestedAt is set when an admin cancelled it while it ran.
	CancelRequestedAt *time.Time `json:"cancel_requested_at"`
	// Truth is the provider's, asked just now ("" when it could not be).
	Truth string `json:"provider_truth_now"`
	// Stuck is the step the operation stands at (the first not DONE), its
	// state, and — for an external step whose outcome is unknown (SENT,
	// UNKNOWN) — its system's truth asked just now. A step FAILED after
	// earlier effects stand (a refund refused once the policy is
	// cancelled) is a person's decision by design, whatever the provider says.
	Stuck      string `json:"stuck_step,omitempty"`
	StuckState string `json:"stuck_state,omitempty"`
	StuckTruth string `json:"stuck_truth_now,omitempty"`
	// Claimed is when recovery first claimed it (zero: never), from its
	// timeline: how long a handed-over operation waited for a worker.
	Claimed time.Time `json:"first_claimed_at"`
	// Timeline is the operation's timeline as the API gave it, kept for
	// whoever studies the run (endstate.json).
	Timeline json.RawMessage `json:"timeline"`
}

// Booking is a booking as GET /api/v1/bookings shows it.
type Booking struct {
	ID     int64  `json:"id"`
	SlotID int64  `json:"slot_id"`
	Status string `json:"status"`
	User   string `json:"-"` // the customer whose list it is in
}

// Run applies every check.
func Run(intents []history.Intent, faults []history.Fault, end EndState) []Violation {
	var vs []Violation
	for _, c := range All {
		vs = append(vs, c.Fn(intents, faults, end)...)
	}
	return vs
}

// A Check is one named judgement.
type Check struct {
	Name string
	Fn   func([]history.Intent, []history.Fault, EndState) []Violation
}

// All lists the checks in the order they are reported.
var All = []Check{
	{"answered", Answered},
	{"agree", Agree},
	{"replay", Replay},
	{"meaning", Meaning},
	{"orphans", Orphans},
	{"no-500", No500},
	{"own-answer", OwnAnswer},
	{"invariants", Invariants},
	{"exits", Exits},
	{"last-resort", LastResort},
}

func violation(check string, in *history.Intent, format string, args ...any) Violation {
	v := Violation{Check: check, Detail: fmt.Sprintf(format, args...)}
	if in != nil {
		v.Intent, v.Key = in.ID, in.Key
		v.Detail = fmt.Sprintf("%s %s %d (key %s): %s", in.Kind, in.User, in.Subject, in.Key, v.Detail)
	}
	return v
}

// Answered: every intent got a final answer.
func Answered(intents []history.Intent, _ []history.Fault, _ EndState) []Violation {
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		if in.FinalAnswer() != nil {
			continue
		}
		labels := make([]string, 0, len(in.Attempts))
		for _, a := range in.Attempts {
			labels = append(labels, a.Label())
		}
		vs = append(vs, violation("answered", in, "no final answer after %d attempts (%s)", len(in.Attempts), summarize(labels)))
	}
	return vs
}

// Agree: every final answer for one key has the same status and body.
func Agree(intents []history.Intent, _ []history.Fault, _ EndState) []Violation {
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		first := in.FinalAnswer()
		if first == nil {
			continue
		}
		for _, a := range in.Attempts {
			if a.Final() && (a.Status != first.Status || !bytes.Equal(a.Body, first.Body)) {
				vs = append(vs, violation("agree", in, "two answers for one key: %s %s (on %s) then %s %s (on %s)",
					first.Label(), clip(first.Body), first.Instance, a.Label(), clip(a.Body), a.Instance))
				break
			}
		}
	}
	return vs
}

// Replay: the request sent again after the drain replays, byte for byte,
// the answer the client got.
func Replay(intents []history.Intent, _ []history.Fault, end EndState) []Violation {
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		first := in.FinalAnswer()
		if first == nil {
			continue
		}
		r, ok := end.Replays[in.ID]
		switch {
		case !ok:
			vs = append(vs, violation("replay", in, "not replayed after the drain"))
		case r.Status == 0:
			vs = append(vs, violation("replay", in, "no answer to the replay: %s", r.Err))
		case !r.Replayed:
			vs = append(vs, violation("replay", in, "sent again, it was not replayed but answered %s %s (the client had %s)", r.Label(), clip(r.Body), first.Label()))
		case r.Status != first.Status || !bytes.Equal(r.Body, first.Body):
			vs = append(vs, violation("replay", in, "the stored answer %s %s differs from what the client got, %s %s", r.Label(), clip(r.Body), first.Label(), clip(first.Body)))
		}
	}
	return vs
}

// No500: no attempt was answered 500, whatever its cause.
func No500(intents []history.Intent, _ []history.Fault, _ EndState) []Violation {
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		for _, a := range in.Attempts {
			if a.Status == 500 {
				vs = append(vs, violation("no-500", in, "answered 500 on %s (request %s)", a.Instance, a.RequestID))
			}
		}
	}
	return vs
}

// OwnAnswer: a request never answers lease-lost (having lost its key it
// has no answer of its own to give), and a valid token is never refused.
func OwnAnswer(intents []history.Intent, _ []history.Fault, _ EndState) []Violation {
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		for _, a := range in.Attempts {
			switch {
			case a.Status == 409 && a.Problem == "lease-lost":
				vs = append(vs, violation("own-answer", in, "answered 409 lease-lost on %s (request %s)%s", a.Instance, a.RequestID, replayedNote(a)))
			case a.Status == 401 || a.Status == 403:
				vs = append(vs, violation("own-answer", in, "a valid token refused: %s on %s", a.Label(), a.Instance))
			}
		}
	}
	return vs
}

func replayedNote(a history.Attempt) string {
	if a.Replayed {
		return ", replayed: stored as the key's answer"
	}
	return ""
}

// Invariants: the app's own verdict, after the drain.
func Invariants(_ []history.Intent, _ []history.Fault, end EndState) []Violation {
	var vs []Violation
	for _, v := range end.Invariants.Violations {
		ids := fmt.Sprint(v.IDs)
		if len(v.Keys) > 0 {
			ids = fmt.Sprint(v.Keys)
		}
		vs = append(vs, Violation{Check: "invariants", Detail: fmt.Sprintf("invariant %d: %s: %s", v.Invariant, v.Detail, ids)})
	}
	return vs
}

// Exits: a process that ended when nobody killed it.
func Exits(_ []history.Intent, faults []history.Fault, _ EndState) []Violation {
	var vs []Violation
	for _, f := range faults {
		if f.Kind == history.Exit {
			vs = append(vs, Violation{Check: "exits", Detail: fmt.Sprintf("%s ended on its own at %s: %s", f.Target, f.Start.Format("15:04:05.000"), f.Detail)})
		}
	}
	return vs
}

// LastResort: an operation waiting for a person although the provider's
// truth, asked after the drain, already says what happened.
func LastResort(_ []history.Intent, _ []history.Fault, end EndState) []Violation {
	var vs []Violation
	for _, op := range end.Waiting {
		switch {
		case op.StuckState != "SENT" && op.StuckState != "UNKNOWN":
			continue // a definite refusal after effects that stand: a person's by design
		case op.CancelRequestedAt != nil:
			// Cancelled by an admin after the provider's cancellation took
			// effect: nothing undoes it and the cancel forbids sending the
			// rest, so a person decides whatever the stuck step's truth
			// (docs/workflows.md, cancelling a live operation).
			continue
		}
		switch op.StuckTruth {
		case "COMPLETED", "REJECTED", "NOT_STARTED":
			vs = append(vs, Violation{Check: "last-resort", Detail: fmt.Sprintf("operation %d (policy %d) waits for a person at %s; its system says %s", op.ID, op.PolicyID, op.Stuck, op.StuckTruth)})
		}
	}
	return vs
}

// Kinds5xx groups the 5xx answers of a run by kind ("503
// database-unavailable"), for the figures; causes adds the cause logged
// for each 500 (request id → the error), where the logs had it.
func Kinds5xx(intents []history.Intent, causes map[string]string) map[string]int {
	kinds := map[string]int{}
	for _, in := range intents {
		for _, a := range in.Attempts {
			if a.Status < 500 {
				continue
			}
			label := a.Label()
			if c := causes[a.RequestID]; c != "" && a.Status == 500 {
				label += ": " + c
			}
			kinds[label]++
		}
	}
	return kinds
}

// summarize folds repeated labels: "no answer: timeout ×3, 503 x".
func summarize(labels []string) string {
	counts := map[string]int{}
	var order []string
	for _, l := range labels {
		if counts[l] == 0 {
			order = append(order, l)
		}
		counts[l]++
	}
	parts := make([]string, len(order))
	for i, l := range order {
		parts[i] = l
		if counts[l] > 1 {
			parts[i] = fmt.Sprintf("%s ×%d", l, counts[l])
		}
	}
	return strings.Join(parts, ", ")
}

func clip(b []byte) string {
	s := string(bytes.TrimSpace(b))
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// ByCheck groups violations by check, in All's order, for the report.
func ByCheck(vs []Violation) [][]Violation {
	order := map[string]int{}
	for i, c := range All {
		order[c.Name] = i
	}
	groups := map[string][]Violation{}
	for _, v := range vs {
		groups[v.Check] = append(groups[v.Check], v)
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(order[a], order[b]) })
	out := make([][]Violation, len(names))
	for i, n := range names {
		out[i] = groups[n]
	}
	return out
}
