package reconciliation

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// This file is what the reconciliation desk says about one operation that
// waits for a person: why it is there, what its system said then and says
// now, which decision the evidence points to and which it rules out. It is
// one pure function (Advise) so that every sentence on a card is derived
// from the same facts and a test can render every combination; the desk
// refuses a decision Advise rules out (Resolve), so the page and the
// server cannot disagree.

// Reason is why recovery handed an operation to a person.
type Reason string

const (
	// ReasonOutOfAttempts: recovery used its attempts without learning the
	// step's outcome (the system could not be asked, or kept saying
	// RUNNING, or a call could still have been on its way).
	ReasonOutOfAttempts Reason = "out_of_attempts"
	// ReasonRefused: the system refused the step definitely, and what the
	// earlier steps did elsewhere stands (a cancelled policy whose refund
	// is refused), so the operation cannot simply fail.
	ReasonRefused Reason = "refused"
	// ReasonInconsistent: the step was in a state recovery cannot resume
	// from (recorded so by recovery).
	ReasonInconsistent Reason = "inconsistent"
	// ReasonCancelled: a person asked to cancel the operation after an
	// earlier step had taken effect elsewhere, and nothing undoes that
	// automatically (workflow/cancel.go): it stopped before a step of this
	// database's own, which only "hand back to recovery" runs.
	ReasonCancelled Reason = "cancelled"
)

// Reasons lists every reason, for counts and filters.
var Reasons = []Reason{ReasonOutOfAttempts, ReasonRefused, ReasonInconsistent, ReasonCancelled}

// ActionAskAgain asks the step's system for the truth of its key now and
// records the answer; it decides nothing (Desk.AskAgain).
const ActionAskAgain = "ask_again"

// TruthUnknown is how a card names "no answer": the status query failed,
// or nobody has asked yet. It is never a system's own answer.
const TruthUnknown = "UNKNOWN"

// Facts is everything Advise needs, read from the evidence (Desk.items).
type Facts struct {
	Reason Reason
	Step   string // the step the operation is stuck at
	System string // the system it calls
	// Then is the system's answer to the last status query before the
	// hand-over; "" when it gave none (could not be asked) or none was made.
	Then external.Truth
	// Now is its answer to the latest status query; "" when it gave none.
	Now external.Truth
	// NowAt is when Now was asked (zero: never asked since the hand-over).
	NowAt time.Time
	// NowError is why the latest status query got no answer.
	NowError string
	// NowIsRefusal: Now is the call's own definite refusal, not a status
	// query's answer (a refused step nobody has asked about since, or whose
	// every question since went unanswered: NowAt and NowError say when
	// and why).
	NowIsRefusal bool
	// ArrivesUntil is the latest deadline any call for the step carried,
	// plus the clock-skew margin: a call may arrive until then.
	ArrivesUntil time.Time
	// Idempotent: the app believes the system applies a repeated key once.
	Idempotent bool
	// CanFail: a refusal of this step fails the operation (nothing done
	// elsewhere stands), so "mark failed" fits it.
	CanFail bool
	// Attempts and MaxAttempts, for the reason's sentence.
	Attempts, MaxAttempts int
	// CancelledBy and Stood, for ReasonCancelled: who asked to cancel, and
	// the earlier steps whose effect stood elsewhere ("provider_cancel at
	// provider").
	CancelledBy string
	Stood       []string
}

// NotStartedConclusive reports whether Now is a NOT_STARTED asked after
// every earlier call's deadline plus the margin: no call can still arrive.
func (f Facts) NotStartedConclusive() bool {
	return f.Now == external.TruthNotStarted && !f.NowAt.IsZero() && !f.NowAt.Before(f.ArrivesUntil)
}

// Advice is a card's texts and buttons.
type Advice struct {
	Headline string `json:"headline"` // one line: what is waiting, and on whom
	Why      string `json:"why"`      // why recovery handed it to a person
	Then     string `json:"then"`     // the truth at the hand-over, in words
	Now      string `json:"now"`      // the truth as last asked, in words
	// Suggested is the action offered first ("" when none fits: the step
	// must be done by hand); Suggestion is the one sentence saying why.
	Suggested  string `json:"suggested"`
	Suggestion string `json:"suggestion"`
	// Unambiguous: the truth now decides it — the suggestion may be applied
	// in bulk with other such items.
	Unambiguous bool     `json:"unambiguous"`
	Actions     []Choice `json:"actions"` // ask again, mark done, retry, mark failed — in that order
}

// Choice is one button on a card.
type Choice struct {
	Action   string `json:"action"` // ask_again | mark_done | retry | mark_failed
	Label    string `json:"label"`
	Enabled  bool   `json:"enabled"`
	Disabled string `json:"disabled_because,omitempty"` // why the evidence rules it out (when !Enabled)
	// Caution is why the evidence argues against an enabled choice and
	// why it is still offered (a person may know what the app does not).
	Caution string `json:"caution,omitempty"`
}

// Action returns the choice for action.
func (a Advice) Action(action string) (Choice, bool) {
	for _, c := range a.Actions {
		if c.Action == action {
			return c, true
		}
	}
	return Choice{}, false
}

// Advise computes a card from its facts. Every sentence states only what
// the facts prove: an unanswered status query is "no answer", never "the
// system never saw the call"; "could apply it twice" only when the system
// is not believed idempotent.
func Advise(f Facts) Advice {
	if f.Reason == ReasonCancelled {
		return f.cancelled()
	}
	a := Advice{
		Headline: fmt.Sprintf("Waiting for a person: %s at %s", f.Step, f.System),
		Why:      f.why(),
		Then:     f.truthText(f.Then, "at the hand-over"),
		Now:      f.nowText(),
	}
	refused := f.Reason == ReasonRefused
	// "Retry" hands the operation back to recovery, which asks first and
	// sends the call again only when the answer allows it: the label says
	// so, since with no answer and no belief in idempotency nothing is sent.
	done, retry, fail, ask := f.doneChoice(), Choice{Action: string(ResolveRetry), Label: "Hand back to recovery", Enabled: true},
		Choice{Action: string(ResolveFailed), Label: "Mark failed", Enabled: true},
		Choice{Action: ActionAskAgain, Label: "Ask " + f.System + " again", Enabled: true}

	// What the truth now rules out.
	switch f.Now {
	case external.TruthCompleted:
		fail.disable(f.System + " says it happened: marking it failed would deny an effect that took place")
		// Handing it back sends nothing (recovery would ask, hear COMPLETED
		// and finish locally): mark done does the same now, on the record.
		retry.disable(f.System + " says it happened: there is nothing to send again, and recovery would only ask and hear the same; mark it done")
	case external.TruthRejected:
		retry.disable(f.System + " refused it: the same call would be refused again")
		if !refused {
			done.disable(f.System + " refused it: nothing was applied, so there is nothing to mark done")
		}
	case external.TruthRunning:
		done.disable(f.System + " is still working on it: it has not happened yet")
		fail.disable(f.System + " is still working on it: it may still complete")
	case external.TruthNotStarted:
		done.disable(f.System + " has no record of the call: marking it done would record an effect that did not happen")
		if !f.NotStartedConclusive() {
			fail.disable(fmt.Sprintf("an earlier call may still arrive until %s", clock(f.ArrivesUntil)))
		}
	}
	// What the step rules out, whatever the truth.
	if refused && retry.Enabled {
		retry.disable(f.Step + " was refused definitely: the same call would be refused again")
	}
	if !f.CanFail {
		fail.disable("what the earlier steps did elsewhere stands, so the operation cannot simply fail")
	}
	// What the belief and an unknown truth argue against, still offered:
	// a person may have checked with the system, which the app cannot.
	if f.Now == "" {
		checked := "offered because you may have checked with " + f.System + " yourself"
		done.caution("the app does not know it happened: " + checked)
		fail.caution("the app does not know it did not happen: " + checked)
	}
	// Handing back, whatever the truth that still allows it, says what
	// recovery will then do — and the belief it does it on (issue 29,
	// finding 8 and requirement 5): the button is not "retry now".
	retry.caution(f.handBackDoes())

	// The first action, from the truth as asked now.
	switch {
	case f.Now == external.TruthCompleted:
		a.Suggested, a.Unambiguous = done.Action, true
		a.Suggestion = f.System + " says the call took effect: mark it done, and the workflow runs on. No second call is needed."
	case refused:
		a.Suggestion = f.System + " refused " + f.Step + " and that refusal stands: do it by hand, then mark it done."
	case f.NotStartedConclusive():
		a.Suggested, a.Unambiguous = retry.Action, true
		a.Suggestion = f.System + " has no record of the call and every earlier call's deadline (plus the margin) had passed when it was asked, " +
			"so none can still arrive: hand it back — recovery sends the same call with the same key, " + f.safeAnyway() + "."
	case f.Now == external.TruthNotStarted:
		a.Suggested = ask.Action
		a.Suggestion = fmt.Sprintf("%s has no record of the call yet, but an earlier call may still arrive until %s: ask again after that.",
			f.System, clock(f.ArrivesUntil))
	case f.Now == external.TruthRejected && f.CanFail:
		a.Suggested, a.Unambiguous = fail.Action, true
		a.Suggestion = f.System + " refused the call and nothing was applied: mark it failed."
	case f.Now == external.TruthRejected: // and the operation cannot fail
		a.Suggestion = f.System + " refused the call and what the earlier steps did elsewhere stands: do " + f.Step + " by hand, then mark it done."
	case f.Now == external.TruthRunning:
		a.Suggested = ask.Action
		a.Suggestion = f.System + " is still working on the call: ask again later."
	default: // no answer
		a.Suggested = ask.Action
		a.Suggestion = "The truth is not known: ask " + f.System + " again first. Decide without it only once you have checked with " +
			f.System + " yourself."
	}
	a.Why, a.Suggestion = sentence(a.Why), sentence(a.Suggestion)
	for _, c := range []*Choice{&ask, &done, &retry, &fail} {
		c.Disabled, c.Caution = sentence(c.Disabled), sentence(c.Caution)
	}
	a.Actions = []Choice{ask, done, retry, fail}
	return a
}

// cancelled is the card of an operation a person asked to cancel after an
// earlier step had taken effect elsewhere: it stopped before a step of this
// database's own. There is no system to ask about that step, nothing to
// mark done (only the workflow writes it) and no failing (what took effect
// stands): the one decision is to hand it back, which sets the cancel
// aside and lets the workflow run on (workflow.Engine.Decide).
func (f Facts) cancelled() Advice {
	stood := strings.Join(f.Stood, ", ")
	if stood == "" {
		stood = "an earlier step"
	}
	by := f.CancelledBy
	if by == "" {
		by = "a person"
	}
	local := f.Step + " is a step of this database's own"
	a := Advice{
		Headline: "Waiting for a person: cancelled before " + f.Step + ", after " + stood + " had taken effect",
		Why: by + " asked to cancel it before " + f.Step + ", but " + stood + " had already taken effect, " +
			"and nothing undoes that automatically.",
		Then:       string(external.TruthCompleted) + ": " + stood + " had taken effect before the cancel stopped the operation.",
		Now:        string(external.TruthCompleted) + ": nothing to ask — " + local + " and calls no other system.",
		Suggested:  string(ResolveRetry),
		Suggestion: "What took effect cannot be undone from here: hand it back to recovery — the cancel is set aside and the workflow runs on from " + f.Step + ".",
	}
	ask := Choice{Action: ActionAskAgain, Label: "Ask again"}
	ask.Disabled = local + ": there is no system to ask"
	done := Choice{Action: string(ResolveDone), Label: f.doneChoice().Label}
	done.Disabled = local + ": marking it done would skip what it writes — handing it back runs it"
	retry := Choice{Action: string(ResolveRetry), Label: "Hand back to recovery", Enabled: true,
		Caution: "sets the cancel aside: recovery runs " + f.Step + " and every step after it, as if nobody had asked to stop"}
	fail := Choice{Action: string(ResolveFailed), Label: "Mark failed"}
	fail.Disabled = stood + " took effect and stands, so the operation cannot simply fail"
	for _, c := range []*Choice{&ask, &done, &retry, &fail} {
		c.Disabled, c.Caution = sentence(c.Disabled), sentence(c.Caution)
	}
	a.Why, a.Suggestion = sentence(a.Why), sentence(a.Suggestion)
	a.Actions = []Choice{ask, done, retry, fail}
	return a
}

// sentence starts s with a capital letter (a system's name may start it).
func sentence(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func (c *Choice) disable(why string) {
	if c.Enabled {
		c.Enabled, c.Disabled = false, why
	}
}

func (c *Choice) caution(why string) {
	if c.Enabled {
		c.Caution = why
	}
}

// handBackDoes is what handing the operation back to recovery does, for
// the truth now and the belief (workflow/recover.go's decision tree), as
// the caution under the button; "" where the suggestion says it.
func (f Facts) handBackDoes() string {
	switch {
	case f.NotStartedConclusive():
		return "" // the suggestion says it
	case f.Now == external.TruthNotStarted:
		return fmt.Sprintf("recovery waits until %s, when no earlier call can still arrive, then sends the same call with the same key — %s",
			clock(f.ArrivesUntil), f.safeAnyway())
	case f.Now == external.TruthRunning:
		belief := f.System + " is believed idempotent, but"
		if !f.Idempotent {
			belief = f.System + " is not believed idempotent, and"
		}
		return "this sends nothing now: " + belief + " recovery never sends a call " + f.System +
			" says it is still working on — it asks again, and finishes it once " + f.System + " says COMPLETED"
	case f.Now == "":
		if f.Idempotent {
			return "recovery asks " + f.System + " first, and sends the same call with the same key only once it may: " + f.System + " is believed idempotent"
		}
		return f.System + " is not believed idempotent: recovery will ask again and back off, and never send the call blind — so this sends nothing until " + f.System + " answers"
	}
	return ""
}

// safeAnyway says why sending a call the system has no record of is safe
// whatever the belief.
func (f Facts) safeAnyway() string {
	if f.Idempotent {
		return "safe: " + f.System + " never applied the first, and is believed idempotent besides"
	}
	return "safe although " + f.System + " is not believed idempotent: it never applied the first, and a late copy is refused after its deadline"
}

func (f Facts) doneChoice() Choice {
	c := Choice{Action: string(ResolveDone), Label: "It happened: mark done", Enabled: true}
	switch {
	case f.Reason == ReasonRefused:
		c.Label = "Done by hand: mark done"
	case f.Step == "provider_cancel":
		c.Label = "Provider confirms: mark cancelled"
	}
	return c
}

// why is the reason's sentence. It says nothing about what the system said
// beyond what Then records.
func (f Facts) why() string {
	switch f.Reason {
	case ReasonRefused:
		return f.System + " refused " + f.Step + " definitely, and what the earlier steps did elsewhere stands, so the operation cannot simply fail."
	case ReasonInconsistent:
		return f.Step + " was in a state recovery cannot resume from."
	}
	// The limit, not a count: the operation's attempts go on growing while
	// it waits (each question recovery asks counts one), so a number here
	// would disagree with the card's own count a minute later.
	used := "Recovery reached its limit of attempts"
	if f.MaxAttempts > 0 {
		used = fmt.Sprintf("Recovery reached its limit of %d attempts", f.MaxAttempts)
		if f.MaxAttempts == 1 {
			used = "Recovery reached its limit of 1 attempt"
		}
	}
	switch f.Then {
	case "":
		if f.Idempotent {
			return used + " and its last status query got no answer. " + sentence(f.System) +
				" is believed idempotent, so sending the call again is safe, but the attempts were used up."
		}
		return used + " and its last status query got no answer. " + sentence(f.System) +
			" is not believed idempotent, so sending the call again without knowing could apply it twice."
	case external.TruthRunning:
		return used + " while " + f.System + " kept saying RUNNING."
	case external.TruthNotStarted:
		return used + " while an earlier call could still have been on its way."
	}
	return used + " without settling the step."
}

func (f Facts) truthText(t external.Truth, when string) string {
	switch t {
	case "":
		return TruthUnknown + ": no answer " + when + " (the status query failed or was not made). That says nothing about whether " +
			f.System + " received the call."
	case external.TruthNotStarted:
		return string(t) + ": " + f.System + " had no record of the call " + when + "."
	case external.TruthRunning:
		return string(t) + ": " + f.System + " had the call and was still working on it " + when + "."
	case external.TruthCompleted:
		return string(t) + ": " + f.System + " had applied the call " + when + "."
	case external.TruthRejected:
		if f.Reason == ReasonRefused && when == "at the hand-over" {
			return string(t) + ": " + f.System + " refused the call itself; nothing was applied."
		}
		return string(t) + ": " + f.System + " had refused the call " + when + "; nothing was applied."
	}
	return string(t)
}

func (f Facts) nowText() string {
	if f.NowIsRefusal {
		if f.NowAt.IsZero() {
			return string(f.Now) + ": the call's own answer, a definite refusal (" + f.System + " has not been asked since); nothing was applied."
		}
		// The query's error is on the evidence page: here it would bury the point.
		return string(f.Now) + ": the call's own answer, a definite refusal; nothing was applied. " + sentence(f.System) +
			" gave no answer when asked again at " + clock(f.NowAt) + ", and no answer does not undo a refusal."
	}
	if f.NowAt.IsZero() {
		return TruthUnknown + ": not asked since the hand-over."
	}
	when := "when asked at " + clock(f.NowAt)
	if f.Now == "" {
		s := f.truthText("", when)
		if f.NowError != "" {
			s += " The query failed: " + f.NowError + "."
		}
		return s
	}
	s := f.truthText(f.Now, when)
	if f.Now == external.TruthNotStarted {
		if f.NotStartedConclusive() {
			s += " Every earlier call's deadline (plus the margin) had passed by then: none can still arrive."
		} else {
			s += " An earlier call may still arrive until " + clock(f.ArrivesUntil) + "."
		}
	}
	return s
}

func clock(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("15:04:05 MST")
}
