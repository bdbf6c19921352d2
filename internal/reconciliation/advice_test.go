package reconciliation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// nowCase is one way the latest status query can have gone.
type nowCase struct {
	name       string
	truth      external.Truth
	asked      bool
	conclusive bool // for NOT_STARTED: asked after every deadline + margin
}

var nowCases = []nowCase{
	{name: "not asked"},
	{name: "no answer", asked: true},
	{name: "NOT_STARTED, deadlines passed", truth: external.TruthNotStarted, asked: true, conclusive: true},
	{name: "NOT_STARTED, a call may arrive", truth: external.TruthNotStarted, asked: true},
	{name: "RUNNING", truth: external.TruthRunning, asked: true},
	{name: "COMPLETED", truth: external.TruthCompleted, asked: true},
	{name: "REJECTED", truth: external.TruthRejected, asked: true},
}

var thenCases = []external.Truth{"", external.TruthNotStarted, external.TruthRunning, external.TruthCompleted, external.TruthRejected}

// Every reason × truth then × truth now (× belief × whether the step may
// fail): the card's sentences agree with each other and with the facts,
// the first action follows the truth now, and every ruled-out action says
// why.
func TestAdviseEveryCombinationAgrees(t *testing.T) {
	t.Parallel()
	askedAt := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	n := 0
	for _, reason := range Reasons {
		if reason == ReasonCancelled {
			continue // its own card: TestAdviseCancelledAfterAnEffect
		}
		for _, then := range thenCases {
			for _, now := range nowCases {
				for _, idempotent := range []bool{false, true} {
					for _, canFail := range []bool{false, true} {
						f := Facts{
							Reason: reason, Step: "provider_cancel", System: "provider", Then: then, Now: now.truth,
							// 7 of 5: the count grows while it waits (each question counts one).
							Idempotent: idempotent, CanFail: canFail, Attempts: 7, MaxAttempts: 5,
							ArrivesUntil: askedAt.Add(time.Second),
						}
						if now.asked {
							f.NowAt = askedAt
							if now.conclusive {
								f.ArrivesUntil = askedAt.Add(-time.Second)
							}
							if now.truth == "" {
								f.NowError = "connection refused"
							}
						}
						name := fmt.Sprintf("%s/then=%s/now=%s/idempotent=%t/canFail=%t", reason, orUnknown(then), now.name, idempotent, canFail)
						checkAdvice(t, name, f, Advise(f))
						n++
					}
				}
			}
		}
	}
	if want := (len(Reasons) - 1) * len(thenCases) * len(nowCases) * 4; n != want {
		t.Fatalf("checked %d combinations, want %d", n, want)
	}
}

func orUnknown(t external.Truth) string {
	if t == "" {
		return TruthUnknown
	}
	return string(t)
}

func checkAdvice(t *testing.T, name string, f Facts, a Advice) {
	t.Helper()
	all := strings.Join([]string{a.Headline, a.Why, a.Then, a.Now, a.Suggestion}, " | ")
	for _, c := range a.Actions {
		all += " | " + c.Label + " " + c.Disabled + " " + c.Caution
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: "+format+"\n  card: %s", append([]any{name}, append(args, all)...)...)
	}
	lower := strings.ToLower(all)
	// Every name the sentences are built from is there: no "at " before
	// nothing, no "whether  received" (a step without a system).
	texts := []string{a.Headline, a.Why, a.Then, a.Now, a.Suggestion}
	for _, c := range a.Actions {
		texts = append(texts, c.Label, c.Disabled, c.Caution)
	}
	for _, text := range texts {
		if strings.Contains(text, "  ") || strings.HasSuffix(text, " at") || strings.Contains(text, " .") || strings.HasPrefix(text, " ") {
			fail("a name is missing in %q", text)
		}
	}

	// Nothing claims what no answer can prove.
	for _, claim := range []string{"never saw", "never received", "did not receive", "never reached"} {
		if strings.Contains(lower, claim) {
			fail("claims %q", claim)
		}
	}
	// "Twice" only where a repeat could apply twice.
	if f.Idempotent && strings.Contains(lower, "twice") {
		fail("says twice of an idempotent system")
	}
	// The truth lines say the truths they were given.
	if !strings.HasPrefix(a.Then, orUnknown(f.Then)+":") {
		fail("then line %q does not say %s", a.Then, orUnknown(f.Then))
	}
	if !strings.HasPrefix(a.Now, orUnknown(f.Now)+":") {
		fail("now line %q does not say %s", a.Now, orUnknown(f.Now))
	}
	// Every action is there once; a disabled one says why, an enabled one does not.
	seen := map[string]bool{}
	for _, c := range a.Actions {
		if seen[c.Action] {
			fail("action %s twice", c.Action)
		}
		seen[c.Action] = true
		if c.Enabled == (c.Disabled != "") {
			fail("action %s enabled=%t with reason %q", c.Action, c.Enabled, c.Disabled)
		}
	}
	for _, want := range []string{ActionAskAgain, string(ResolveDone), string(ResolveRetry), string(ResolveFailed)} {
		if !seen[want] {
			fail("no %s button", want)
		}
	}
	if ask, _ := a.Action(ActionAskAgain); !ask.Enabled {
		fail("ask again disabled")
	}
	// The first action is offered, enabled, and follows the truth now.
	if a.Suggestion == "" {
		fail("no sentence saying why")
	}
	if a.Suggested != "" {
		if c, ok := a.Action(a.Suggested); !ok || !c.Enabled {
			fail("suggests %s, which is not enabled", a.Suggested)
		}
	}
	refused := f.Reason == ReasonRefused
	want := ""
	switch {
	case f.Now == external.TruthCompleted:
		want = string(ResolveDone)
	case refused:
		want = ""
	case f.NotStartedConclusive():
		want = string(ResolveRetry)
	case f.Now == external.TruthRejected && f.CanFail:
		want = string(ResolveFailed)
	case f.Now == external.TruthRejected:
		want = ""
	default: // unknown, RUNNING, NOT_STARTED while a call may arrive
		want = ActionAskAgain
	}
	if a.Suggested != want {
		fail("suggests %q, want %q", a.Suggested, want)
	}
	if a.Unambiguous != (want == string(ResolveDone) || want == string(ResolveRetry) || want == string(ResolveFailed)) {
		fail("unambiguous=%t with suggestion %q", a.Unambiguous, a.Suggested)
	}
	// The suggestion's sentence speaks of the truth it follows.
	if f.Now == "" && !refused && !strings.Contains(a.Suggestion, "not known") {
		fail("suggestion %q on an unknown truth", a.Suggestion)
	}
	if f.Now != "" && strings.Contains(a.Suggestion, "not known") {
		fail("suggestion %q says unknown of %s", a.Suggestion, f.Now)
	}
	// What the truth now rules out is disabled.
	done, _ := a.Action(string(ResolveDone))
	retry, _ := a.Action(string(ResolveRetry))
	failed, _ := a.Action(string(ResolveFailed))
	if (f.Now == external.TruthNotStarted || f.Now == external.TruthRunning) && done.Enabled {
		fail("mark done enabled while the system says %s", f.Now)
	}
	if f.Now == external.TruthRejected && !refused && done.Enabled {
		fail("mark done enabled on a refusal")
	}
	if (f.Now == external.TruthCompleted || f.Now == external.TruthRunning) && failed.Enabled {
		fail("mark failed enabled while the system says %s", f.Now)
	}
	if f.Now == external.TruthNotStarted && !f.NotStartedConclusive() && failed.Enabled {
		fail("mark failed enabled while a call may still arrive")
	}
	if !f.CanFail && failed.Enabled {
		fail("mark failed enabled on a step that cannot fail")
	}
	if (f.Now == external.TruthRejected || refused) && retry.Enabled {
		fail("retry enabled on a refusal")
	}
	if f.Now == "" && !refused && !done.Enabled {
		fail("mark done disabled on an unknown truth: a person who checked must be able to say so")
	}
	// The belief as well as the truth (issue 29): a call the system says
	// took effect is not sent again, and what the evidence argues against
	// but still offers says why on the card.
	if f.Now == external.TruthCompleted && retry.Enabled {
		fail("retry enabled while the system says COMPLETED")
	}
	if f.Now == "" {
		for _, c := range []Choice{done, failed, retry} {
			if c.Enabled && c.Caution == "" {
				fail("%s enabled on an unknown truth without a word of caution", c.Action)
			}
		}
		if retry.Enabled && !f.Idempotent && !strings.Contains(retry.Caution, "not believed idempotent") {
			fail("retry on an unknown truth does not say the system is not believed idempotent: %q", retry.Caution)
		}
	}
	// The belief as well as the truth, for every truth that leaves "hand
	// back" enabled (requirement 5): the card says what recovery will do
	// with it, and names the belief that decides whether it sends.
	if retry.Enabled {
		says := retry.Caution
		if a.Suggested == retry.Action {
			says += " " + a.Suggestion
		}
		if strings.TrimSpace(says) == "" {
			fail("hand back enabled without saying what recovery will do")
		}
		if f.Idempotent && (!strings.Contains(says, "is believed idempotent") || strings.Contains(says, "not believed idempotent")) {
			fail("hand back on an idempotent system does not say it is believed idempotent: %q", says)
		}
		if !f.Idempotent && !strings.Contains(says, "not believed idempotent") {
			fail("hand back on a system not believed idempotent does not say so: %q", says)
		}
		if strings.Contains(strings.ToLower(retry.Label), "retry") {
			fail("the button says %q, but handing back sends nothing until recovery may", retry.Label)
		}
	}
	for _, c := range a.Actions {
		if !c.Enabled && c.Caution != "" {
			fail("%s is disabled and cautioned at once", c.Action)
		}
	}
	// One count of attempts: the card's reason names the limit, never a
	// count that disagrees with the operation's own.
	if strings.Contains(a.Why, fmt.Sprint(f.Attempts)) || strings.Contains(a.Why, "used all") {
		fail("the reason names a count of attempts (%d of %d) the card's own count would contradict: %q", f.Attempts, f.MaxAttempts, a.Why)
	}
}

func TestAdviseNotStartedNeedsEveryDeadlinePassed(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f := Facts{Reason: ReasonOutOfAttempts, Step: "provider_cancel", System: "provider", Now: external.TruthNotStarted,
		NowAt: at, ArrivesUntil: at.Add(time.Millisecond), CanFail: true}
	if a := Advise(f); a.Suggested != ActionAskAgain || a.Unambiguous {
		t.Errorf("a millisecond before the last deadline: %q (unambiguous %t)", a.Suggested, a.Unambiguous)
	}
	f.ArrivesUntil = at
	if a := Advise(f); a.Suggested != string(ResolveRetry) || !a.Unambiguous {
		t.Errorf("at the last deadline: %q (unambiguous %t)", a.Suggested, a.Unambiguous)
	}
}

// A person cancelled the operation after its provider call took effect
// (workflow/cancel.go): it stopped before mark_cancelled, a step of this
// database's own. The card says so — not "mark_cancelled at " with no
// system, not "a state recovery cannot resume from" — offers nothing to
// ask, and offers the one decision the engine allows (Decide): hand it
// back, which sets the cancel aside.
func TestAdviseCancelledAfterAnEffect(t *testing.T) {
	t.Parallel()
	f := Facts{Reason: ReasonCancelled, Step: "mark_cancelled", CancelledBy: "admin",
		Stood: []string{"provider_cancel at provider"}, Then: external.TruthCompleted, Now: external.TruthCompleted}
	a := Advise(f)
	all := strings.Join([]string{a.Headline, a.Why, a.Then, a.Now, a.Suggestion}, " | ")
	for _, c := range a.Actions {
		all += " | " + c.Label + " " + c.Disabled + " " + c.Caution
	}
	for _, want := range []string{"cancelled before mark_cancelled", "provider_cancel at provider", "admin asked to cancel", "set aside"} {
		if !strings.Contains(strings.ToLower(all), strings.ToLower(want)) {
			t.Errorf("the card does not say %q:\n%s", want, all)
		}
	}
	for _, wrong := range []string{"cannot resume", " at |", "yourself", "not believed idempotent", "Ask mark_cancelled"} {
		if strings.Contains(all+"|", wrong) {
			t.Errorf("the card says %q:\n%s", wrong, all)
		}
	}
	if !strings.HasPrefix(a.Then, "COMPLETED:") || !strings.HasPrefix(a.Now, "COMPLETED:") {
		t.Errorf("truth lines %q / %q", a.Then, a.Now)
	}
	enabled := map[string]bool{}
	for _, c := range a.Actions {
		enabled[c.Action] = c.Enabled
		if c.Enabled == (c.Disabled != "") {
			t.Errorf("%s enabled=%t with reason %q", c.Action, c.Enabled, c.Disabled)
		}
	}
	want := map[string]bool{ActionAskAgain: false, string(ResolveDone): false, string(ResolveRetry): true, string(ResolveFailed): false}
	for action, on := range want {
		if enabled[action] != on {
			t.Errorf("%s enabled=%t, want %t (the engine allows only a retry here)", action, enabled[action], on)
		}
	}
	if a.Suggested != string(ResolveRetry) || a.Unambiguous {
		t.Errorf("suggests %q (unambiguous %t), want a retry decided on its own card", a.Suggested, a.Unambiguous)
	}
}
