package views

import (
	"net/http"
	"strconv"
	"strings"
)

func httpStatusText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Error"
}

func int64Text(n int64) string { return strconv.FormatInt(n, 10) }

// statusClass maps a status to the CSS class family that colours it.
func statusClass(status string) string {
	switch status {
	case "ACTIVE", "AVAILABLE", "SUCCEEDED", "COMPLETED", "CONFIRMED", "DONE", "confirmed", "won":
		return "ok"
	case "CANCELLED", "BOOKED", "FAILED", "REJECTED", "NOT_STARTED", "rejected", "refused":
		return "done"
	case "IN_PROGRESS", "RECOVERING", "RUNNING", "PENDING", "UNKNOWN":
		return "busy"
	case "NEEDS_RECONCILIATION", "unknown", "error":
		return "alert"
	default:
		return "neutral"
	}
}

func slotLabel(status string) string {
	if status == "AVAILABLE" {
		return "free"
	}
	return "booked"
}

func itoa(n int) string { return strconv.Itoa(n) }

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// truthExplanation says what a system's truth of a key means.
func truthExplanation(truth string) string {
	switch truth {
	case "NOT_STARTED":
		return "No call with this key has arrived there yet. A status answer describes the past: a call may still be on its way until its deadline (plus the clock-skew margin) has passed; only then is it safe to send it again."
	case "RUNNING":
		return "It accepted the call and is still working on it."
	case "COMPLETED":
		return "It applied the call: the effect happened, once."
	case "REJECTED":
		return "It refused the call; nothing was applied."
	default:
		return ""
	}
}

// shortKey shows the start of a long key.
func shortKey(k string) string {
	if len(k) > 12 {
		return k[:12] + "…"
	}
	return k
}

// plural says "1 event", "3 events", "4 identities".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if stem, ok := strings.CutSuffix(noun, "y"); ok && stem != "" && !strings.ContainsAny(stem[len(stem)-1:], "aeiou") {
		return strconv.Itoa(n) + " " + stem + "ies"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// Plural is plural for the handlers' notices: one rule for counts in words.
var Plural = plural

// joinOr writes ["policy", "booking"] as "policy or booking".
func joinOr(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// outcomeClass colours a delivery outcome (internal/events).
func outcomeClass(outcome string) string {
	switch outcome {
	case "applied":
		return "ok"
	case "duplicate":
		return "done"
	case "deferred":
		return "busy"
	case "failed":
		return "alert"
	default:
		return "neutral"
	}
}

// countdownText fills the countdown's sentence ("recovery may claim this
// in %s") with secs; app.js does the same every second in the browser.
func countdownText(sentence string, secs int) string {
	if secs <= 0 {
		return strings.Replace(sentence, "in %s", "now", 1)
	}
	return strings.Replace(sentence, "%s", strconv.Itoa(secs)+" s", 1)
}

// ordinal is 1st, 2nd, 3rd, 4th … for the run number.
func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	if n == 1 {
		return "first"
	}
	return strconv.Itoa(n) + suffix
}

// baseName is "run.go:142" of "internal/workflow/run.go:142".
func baseName(where string) string {
	if i := strings.LastIndex(where, "/"); i >= 0 {
		return where[i+1:]
	}
	return where
}

// times says how often something happened to one subject, for the ledgers'
// duplicate badges: "cancelled twice", "cancelled 5 times".
func times(what string, n int64) string {
	switch n {
	case 1:
		return what + " once"
	case 2:
		return what + " twice"
	}
	return what + " " + strconv.FormatInt(n, 10) + " times"
}

// labTry is a lab page's "try this": run it, then read the counts that
// should be zero. It names only the lab's own columns, by their labels, so it
// cannot send a reader to a count the result table does not show; a lab with
// no broken variant (the timeout lab) has no such count and says what to
// watch instead.
func labTry(l LabInfo) string {
	if l.Try != "" {
		return l.Try
	}
	var bad []string
	for _, c := range l.Columns {
		if c.Bad {
			bad = append(bad, "“"+c.Label+"”")
		}
	}
	switch len(bad) {
	case 0:
		return "press Run the lab, then watch the operations below: each meets its fault, stays IN_PROGRESS, and recovery finishes it once it has asked the provider what really happened. The provider's ledger shows one cancellation per policy."
	case 1:
		return "press Run the lab, then compare " + bad[0] + ": above zero (highlighted) for the broken variant, zero for the correct one. Run it again: the same numbers."
	}
	return "press Run the lab, then compare " + strings.Join(bad[:len(bad)-1], ", ") + " and " + bad[len(bad)-1] +
		": the broken variant shows at least one of them above zero (highlighted), the correct one keeps every one at zero. Run it again: the same numbers."
}

// labNoRun is what a lab's page says before a run: the timeout lab has no
// broken variant (no count that should be zero), only three faults (the
// fresh reader's finding 20).
func labNoRun(l LabInfo) string {
	for _, c := range l.Columns {
		if c.Bad {
			return "Run the lab to see the broken variants and the correct ones side by side."
		}
	}
	return "Run the lab to see its operations side by side, live, until recovery has finished each."
}

// labWhat is a lab page's "what you are looking at".
func labWhat(l LabInfo) string {
	for _, c := range l.Columns {
		if c.Bad {
			return "the broken variants and the correct ones, run one after the other on the same data: the table counts what each did, the timelines below say why."
		}
	}
	return "three faults that look the same to the app, run side by side: the table counts the first calls and their timeouts, the operations below show how recovery told them apart."
}

// forConsumer names whom an injection applies to, in the arming form's
// words: "consumer ledger", or "every consumer" for none chosen.
func forConsumer(name string) string {
	if name == "" {
		return "every consumer"
	}
	return "consumer " + name
}
