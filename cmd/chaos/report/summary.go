// Package report turns a chaos run into figures: a text summary for the
// terminal and an HTML page with a timeline — the faults injected above,
// the answers the clients got, by status, below — drawn as inline SVG, so
// the page needs nothing fetched when it is opened and the plot can be
// committed next to the documentation.
package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/check"
	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// Summary is every figure of a run.
type Summary struct {
	Seed     uint64
	Started  time.Time
	Healed   time.Time
	Drained  time.Time
	Duration time.Duration // start → heal
	Drain    time.Duration // heal → drained

	Faults   map[string]int // by kind
	Kills    map[string]int // by target
	Crashes  map[string]int // crash-point kills by point
	Requests int
	Intents  map[string]int // by kind
	Answers  map[string]int // by label
	Kinds5xx map[string]int
	Effects  int   // provider effects applied
	Doubled  int   // policies with more than one effect
	Late     int64 // calls the provider refused as past their deadline
	Events   check.Events
	Waiting  int // operations waiting for a person at the end (the invariants' count: the reconciliation list shows 100)
	// ClaimLags are, for each cancellation answered 202 (handed over to
	// recovery), the time from the answer to recovery's claim, sorted.
	ClaimLags []time.Duration

	Violations []check.Violation
	Notes      []string
	Settings   []string // the knobs of the run, "NAME=value"

	intents []history.Intent
	faults  []history.Fault
}

// Summarize computes the figures.
func Summarize(log *history.Log, intents []history.Intent, faults []history.Fault, end check.EndState, kinds5xx map[string]int, vs []check.Violation, settings []string) Summary {
	s := Summary{
		Seed: log.Seed, Started: log.Started, Healed: log.Healed, Drained: log.Drained,
		Faults: map[string]int{}, Kills: map[string]int{}, Crashes: map[string]int{},
		Intents: map[string]int{}, Answers: map[string]int{}, Kinds5xx: kinds5xx,
		Violations: vs, Notes: log.Notes, Settings: settings, Waiting: int(max(end.Invariants.Counts.OperationsByStatus["NEEDS_RECONCILIATION"], int64(len(end.Waiting)))), Late: end.Late, Events: end.Events,
		intents: intents, faults: faults,
	}
	s.Duration = s.Healed.Sub(s.Started)
	if !s.Drained.IsZero() {
		s.Drain = s.Drained.Sub(s.Healed)
	}
	for _, f := range faults {
		s.Faults[f.Kind]++
		switch f.Kind {
		case history.Kill:
			s.Kills[f.Target]++
		case history.CrashKill:
			s.Crashes[cmp.Or(f.Detail, "?")]++
		}
	}
	for _, in := range intents {
		s.Intents[in.Kind]++
		for _, a := range in.Attempts {
			s.Requests++
			s.Answers[a.Label()]++
		}
	}
	for _, in := range intents {
		a := in.FinalAnswer()
		if in.Kind != history.Cancel || a == nil || a.Status != 202 {
			continue
		}
		var b struct {
			ID int64 `json:"id"`
		}
		json.Unmarshal(a.Body, &b)
		if op, ok := end.Operations[b.ID]; ok && !op.Claimed.IsZero() {
			s.ClaimLags = append(s.ClaimLags, max(op.Claimed.Sub(a.Done), 0))
		}
	}
	slices.Sort(s.ClaimLags)
	for _, n := range end.Effects {
		s.Effects += n
		if n > 1 {
			s.Doubled++
		}
	}
	return s
}

// KillsTotal is every SIGKILL: by the nemesis and at crash points.
func (s Summary) KillsTotal() int { return s.Faults[history.Kill] + s.Faults[history.CrashKill] }

// DBRestarts counts immediate restarts and stops alike: each took the
// database away from every connection.
func (s Summary) DBRestarts() int { return s.Faults[history.DBRestart] + s.Faults[history.DBDown] }

// DelayWindows counts delay windows and held calls alike.
func (s Summary) DelayWindows() int { return s.Faults[history.Delay] + s.Faults[history.Hold] }

// Count500 is how many attempts were answered 500.
func (s Summary) Count500() int {
	n := 0
	for label, c := range s.Answers {
		if strings.HasPrefix(label, "500") {
			n += c
		}
	}
	return n
}

// ClaimLagText describes ClaimLags: "p50 120ms, p99 800ms, max 1.2s of 84".
func (s Summary) ClaimLagText() string {
	n := len(s.ClaimLags)
	if n == 0 {
		return "no operation was handed over"
	}
	at := func(p float64) time.Duration { return s.ClaimLags[min(n-1, int(p*float64(n)))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s (%d operations handed over)", at(0.5), at(0.9), at(0.99), s.ClaimLags[n-1].Round(time.Millisecond), n)
}

// EventsText describes the outbox: "1,200 sent over nats, 0 dead; repeats
// caught: broker 3, notifications 5, ledger 4".
func (s Summary) EventsText() string {
	e := s.Events
	t := fmt.Sprintf("%d sent over %s, %d pending, %d dead; repeats caught: broker %d", e.Sent, cmp.Or(e.Transport, "?"), e.Pending, e.Dead, e.BrokerDuplicates)
	for _, c := range e.Consumers {
		t += fmt.Sprintf(", %s %d (applied %d)", c.Consumer, c.Duplicates, c.Applied)
	}
	t += fmt.Sprintf("; history: %d early events parked then applied, %d parked now", e.History.ParkedThenApplied, e.History.ParkedNow)
	return t
}

// Text writes the summary for a terminal.
func (s Summary) Text(w io.Writer) {
	fmt.Fprintf(w, "chaos run, seed %d: %s of faults, drained in %s\n", s.Seed, s.Duration.Round(time.Second), s.Drain.Round(100*time.Millisecond))
	fmt.Fprintf(w, "  kills           %d (%s; at crash points %d: %s)\n", s.KillsTotal(), counts(s.Kills), s.Faults[history.CrashKill], counts(s.Crashes))
	fmt.Fprintf(w, "  pauses          %d\n", s.Faults[history.Pause])
	fmt.Fprintf(w, "  network delays  %d (%d windows of delay, %d of held calls)\n", s.DelayWindows(), s.Faults[history.Delay], s.Faults[history.Hold])
	fmt.Fprintf(w, "  db restarts     %d (%d immediate, %d down for a while)\n", s.DBRestarts(), s.Faults[history.DBRestart], s.Faults[history.DBDown])
	if n := s.Faults[history.Failover]; n > 0 {
		fmt.Fprintf(w, "  db failovers    %d (the primary killed, the synchronous standby promoted)\n", n)
	}
	fmt.Fprintf(w, "  fault flips     %d (belief changes %d)\n", s.Faults[history.Flip], s.Faults[history.Belief])
	fmt.Fprintf(w, "  callbacks       %d mode changes; %d reorders of the history consumer's deliveries\n", s.Faults[history.Callbacks], s.Faults[history.Reorder])
	fmt.Fprintf(w, "  exits on own    %d\n", s.Faults[history.Exit])
	fmt.Fprintf(w, "  intents         %d (%s)\n", sum(s.Intents), counts(s.Intents))
	fmt.Fprintf(w, "  requests        %d\n", s.Requests)
	fmt.Fprintf(w, "  answers         %s\n", counts(s.Answers))
	fmt.Fprintf(w, "  5xx by kind     %s\n", orNone(counts(s.Kinds5xx)))
	fmt.Fprintf(w, "  500s            %d\n", s.Count500())
	fmt.Fprintf(w, "  effects         %d at the provider (%d policies more than once; %d late calls refused)\n", s.Effects, s.Doubled, s.Late)
	fmt.Fprintf(w, "  events          %s\n", s.EventsText())
	fmt.Fprintf(w, "  for a person    %d operations wait in reconciliation\n", s.Waiting)
	fmt.Fprintf(w, "  hand-over→claim %s\n", s.ClaimLagText())
	for _, n := range s.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	if len(s.Violations) == 0 {
		fmt.Fprintf(w, "violations: none\n")
		return
	}
	fmt.Fprintf(w, "violations: %d\n", len(s.Violations))
	for _, group := range check.ByCheck(s.Violations) {
		fmt.Fprintf(w, "  %-12s %d\n", group[0].Check, len(group))
		for _, v := range group[:min(len(group), 5)] {
			fmt.Fprintf(w, "      %s\n", oneLine(v.Detail))
		}
	}
}

// counts renders a map as "a 3, b 1", largest first.
func counts(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(m[b], m[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func orNone(s string) string { return cmp.Or(s, "none") }

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ⏎ ")
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}
