package labs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Lab is one lesson: a scenario, its variants, and what to read.
type Lab struct {
	Number int    `json:"number"` // its place in the list (docs/labs.md)
	Name   string `json:"name"`   // in URLs: /labs/{name}, /api/v1/labs/{name}/runs
	Title  string `json:"title"`
	// Summary is the lab in one sentence — the mistake and what corrects
	// it — as the labs' index lists it and the lab's page opens with it: one
	// text, so the two never say different things.
	Summary string `json:"summary"`
	// Lesson is the one paragraph the page opens with: what goes wrong, and
	// what prevents it.
	Lesson string `json:"lesson"`
	// Columns are the counts the result table shows, in order.
	Columns []Column `json:"columns"`
	// Code lists the lines that make the difference between the variants.
	Code []CodeRef `json:"code"`
	// RunHint says under the Run button what a run does; "" for the usual
	// "broken, then correct".
	RunHint string `json:"-"`
	// Try is the page's "try this" when the usual "compare the broken
	// variant with the correct one" does not fit ("" for the usual). It
	// quotes every count that should stay zero by its label, and no other.
	Try string `json:"-"`
	// Needs names what the lab needs beyond PostgreSQL ("" when nothing):
	// without it a run answers 503 lab-unavailable.
	Needs string `json:"needs,omitempty"`

	// run runs every variant and returns them in order, broken first.
	run func(ctx context.Context, e *env) ([]Variant, error)
	// check, when set, says what this machine lacks for a run (nil:
	// nothing), without running anything: the page says it before Run.
	check func(cfg Config) error
}

// Column is one count of the result table: a key of Variant.Counts and what
// it means in this lab.
type Column struct {
	Key   string `json:"key"`
	Label string `json:"label"`
	// Bad marks a count that should be zero: a duplicate, a loss.
	Bad bool `json:"bad,omitempty"`
}

// The counts most labs report.
var (
	colExecutions = Column{Key: "executions", Label: "executions"}
	colEffects    = Column{Key: "effects", Label: "effects"}
	colDuplicates = Column{Key: "duplicates", Label: "duplicate effects", Bad: true}
)

// CodeRef points at one line of idemlab's source by what the line says. The
// line's number is looked up in the embedded source when the catalogue is
// built, so an edit above the line moves the link with it; a test fails when
// no line says Text any more.
type CodeRef struct {
	Path string `json:"path"` // from the repository's root
	Line int    `json:"line"` // found from Text; 0 when no line says it
	Text string `json:"text"` // the whole line, trimmed
	Says string `json:"says"` // why it matters, in a sentence
}

// Variant is one run of the scenario: its numbers, its timeline, a verdict.
type Variant struct {
	Name  string `json:"name"` // "broken", "correct", or the policy it tries
	Title string `json:"title"`
	// Broken marks the variant made wrong on purpose.
	Broken bool `json:"broken"`
	// Held reports whether the promise the lab is about held in this run.
	Held     bool           `json:"held"`
	Counts   map[string]int `json:"counts"`
	Timeline []Event        `json:"timeline"`
	Verdict  string         `json:"verdict"`
	// NotRun says why the variant could not run here ("" when it ran).
	NotRun string `json:"not_run,omitempty"`
}

// Event is one line of a variant's timeline.
type Event struct {
	AtMS  float64 `json:"at_ms"` // since the variant started
	Actor string  `json:"actor"`
	What  string  `json:"what"`
	// Bad marks the moment something went wrong.
	Bad bool `json:"bad,omitempty"`
}

// timeline records a variant's events as they happen, from any goroutine.
// The scenario's schedule decides their order, so it is the same every run.
type timeline struct {
	start  time.Time
	mu     sync.Mutex
	events []Event
	// last is the latest event's text before any repeat count, and repeats
	// how many times it came in a row: a client polling "409, try later"
	// is one line, "(×5)", not five.
	last    string
	repeats int
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

// say records what actor did.
func (t *timeline) say(actor, format string, args ...any) { t.add(false, actor, format, args...) }

// wrong records the moment something went wrong.
func (t *timeline) wrong(actor, format string, args ...any) { t.add(true, actor, format, args...) }

func (t *timeline) add(bad bool, actor, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at := float64(time.Since(t.start).Microseconds()) / 1000
	what := fmt.Sprintf(format, args...)
	if n := len(t.events); n > 0 && t.events[n-1].Actor == actor && t.last == what {
		t.repeats++
		t.events[n-1].What = fmt.Sprintf("%s (×%d, until +%.1f ms)", what, t.repeats, at)
		return
	}
	t.last, t.repeats = what, 1
	t.events = append(t.events, Event{AtMS: at, Actor: actor, What: what, Bad: bad})
}

func (t *timeline) list() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.events)
}

// labCrash is a lab's crash point: the variant's "process" stops there —
// nothing after the point runs, and nothing it held in memory survives for
// the retry, which starts afresh as another process would. Only what was
// durable (committed rows, Redis keys) is left, exactly as after a SIGKILL.
type labCrash string

// errCrashed ends a variant's work at its crash point.
var errCrashed = errors.New("labs: crashed at the lab's crash point")

// ErrUnknownLab: no lab has that name.
var ErrUnknownLab = errors.New("labs: no such lab")

// held says whether the variant ran and none of its bad counts is above zero.
func (l *Lab) held(v Variant) bool {
	if v.NotRun != "" {
		return false
	}
	for _, c := range l.Columns {
		if c.Bad && v.Counts[c.Key] > 0 {
			return false
		}
	}
	return true
}

// plural says "1 effect", "2 effects": a verdict counts in words a reader
// does not have to correct.
func plural[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprint(n) + " " + noun + "s"
}
