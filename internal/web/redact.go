package web

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// What a customer may read of an operation. The error texts the workflow
// and recovery record are written for the people who run the system: they
// name the provider's address, a transport's error, a status code. A
// customer gets, instead of last_error, a sentence about what the status
// means for them, and timelines with addresses taken out; an admin sees
// every text as recorded.

// customerSummaries replace last_error for a customer, by status, while the
// provider's answer is what is missing; refundSummaries once the policy is
// cancelled and the refund is.
var customerSummaries = map[string]string{
	workflow.StatusInProgress:          "The provider's answer is not known yet; the cancellation will be finished automatically.",
	workflow.StatusRecovering:          "The provider's answer is not known yet; the cancellation is being finished automatically.",
	workflow.StatusFailed:              "The provider refused the cancellation. You may try again.",
	workflow.StatusNeedsReconciliation: "The provider's answer could not be confirmed; a person is checking it.",
}

var refundSummaries = map[string]string{
	workflow.StatusInProgress:          "The policy is cancelled; the refund's answer is not known yet and will be settled automatically.",
	workflow.StatusRecovering:          "The policy is cancelled; the refund is being settled automatically.",
	workflow.StatusNeedsReconciliation: "The policy is cancelled; the refund could not be confirmed, and a person is checking it.",
}

// depositSummaries and depositRefundSummaries are the deposit saga's
// (internal/slots/deposit.go): booking a slot that needs a deposit, and
// cancelling such a booking.
var depositSummaries = map[string]string{
	workflow.StatusInProgress:          "The payments service's answer about your deposit is not known yet; the slot stays held for you meanwhile.",
	workflow.StatusRecovering:          "The deposit's outcome is being found out automatically; the slot stays held for you meanwhile.",
	workflow.StatusFailed:              "The deposit was declined, so the hold was released. Nothing was charged; you may try again.",
	workflow.StatusNeedsReconciliation: "The deposit's outcome could not be confirmed; a person is checking it. The slot stays held for you.",
}

var depositRefundSummaries = map[string]string{
	workflow.StatusInProgress:          "The refund's answer is not known yet; the booking stands until the refund is confirmed.",
	workflow.StatusRecovering:          "The refund is being settled automatically; the booking stands until it is confirmed.",
	workflow.StatusFailed:              "The refund was refused, so the booking stands. You may try again.",
	workflow.StatusNeedsReconciliation: "The refund could not be confirmed; a person is checking it. The booking stands meanwhile.",
}

// operationFor is op as the caller of c may read it: the one rule for every
// answer that carries an operation — a cancellation's, a deposit booking's
// or its cancellation's, stored with the key and replayed, or read. It is
// applied before an answer is stored, so a replay is the redacted bytes
// too. An admin reads every text as recorded (docs/api.md); anyone else
// reads customerOperation.
func operationFor(c echo.Context, op workflow.Operation) workflow.Operation {
	if u, _ := userFrom(c); u.IsAdmin() {
		return op
	}
	return customerOperation(op)
}

// customerOperation is op as its customer sees it: the summary for its
// status instead of last_error, its steps' answers without the error texts
// recorded for operators (customerAnswer), and no owner token (the fence is
// the operators' business, not a customer's).
func customerOperation(op workflow.Operation) workflow.Operation {
	op.OwnerToken = nil
	if op.OwnerID != nil {
		owner := customerActor(*op.OwnerID)
		op.OwnerID = &owner
	}
	if op.LastError != nil {
		summaries := customerSummaries
		switch {
		case op.Type == slots.OperationBookDeposit:
			summaries = depositSummaries
		case op.Type == slots.OperationCancelDeposit:
			summaries = depositRefundSummaries
		default:
			if s, ok := op.Step(policies.StepProviderCancel); ok && s.State == workflow.StepDone {
				summaries = refundSummaries
			}
		}
		s, ok := summaries[op.Status]
		if !ok {
			s = "The cancellation met a problem; it is being looked after."
		}
		if why := whyNotDone(op); why != "" { // the summary's reason, from the facts
			s = why
		}
		op.LastError = &s
	}
	steps := make([]workflow.StepRecord, len(op.Steps))
	for i, st := range op.Steps {
		st.Answer = customerAnswer(st)
		steps[i] = st
	}
	op.Steps = steps
	return op
}

// othersOperation is another customer's operation as a customer sees it on
// the recovery page: recovery at work on it, without what that customer
// wrote or sent — the reason, the request key, the steps' requests — nor
// what it is about (its policy or booking, its last error).
func othersOperation(op workflow.Operation) workflow.Operation {
	op.Reason, op.IdempotencyKey = "", ""
	op.PolicyID, op.BookingID, op.LastError = 0, 0, nil // what it is about is theirs
	steps := make([]workflow.StepRecord, len(op.Steps))
	for i, st := range op.Steps {
		st.Request = nil
		steps[i] = st
	}
	op.Steps = steps
	return op
}

// customerCalls is the log of calls without owner tokens or error texts: a
// status query that failed says why in words (statusFailure).
func customerCalls(calls []readmodel.CallRecord) []readmodel.CallRecord {
	out := make([]readmodel.CallRecord, len(calls))
	for i, c := range calls {
		if c.Kind == "status" && c.Truth == nil && c.Detail != "" {
			c.Detail = statusFailure(c.System, c.Detail)
		} else {
			c.Detail = customerText(c.Detail)
		}
		c.OwnerToken, c.Actor = nil, customerActor(c.Actor)
		out[i] = c
	}
	return out
}

// statusFailure is a failed status query as a customer reads it: its
// cause in words ("The provider answered with an error (HTTP 503)"), or
// that the system could not be asked — never the transport's text.
func statusFailure(system, detail string) string {
	if cause := views.ErrorCause(detail); cause != "" {
		return cause
	}
	return "the " + system + " could not be asked"
}

// customerAnswer is what a customer reads of a step's answer: what it came
// to (outcome, truth), the other system's reason for a refusal and why a
// step was skipped or given up — not the transport's error text, which
// becomes "no usable answer".
func customerAnswer(st workflow.StepRecord) json.RawMessage {
	if len(st.Answer) == 0 {
		return st.Answer
	}
	var v map[string]any
	if json.Unmarshal(st.Answer, &v) != nil {
		return nil // not an answer this code wrote: nothing of it
	}
	out := map[string]any{}
	for _, k := range []string{"outcome", "truth", "reason", "skipped", "abandoned", "decision"} { // decision: a person's, not a refusal (howFailed)
		if x, ok := v[k]; ok {
			if s, ok := x.(string); ok {
				x = customerText(s)
			}
			out[k] = x
		}
	}
	if _, ok := v["error"]; ok {
		system := "the other system"
		if st.System != nil {
			system = *st.System
		}
		out["error"] = "no usable answer from " + system
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil
	}
	return b
}

// errorTexts are where the workflow's free text quotes an error as
// recorded (workflow.describeOutcome, the recovery's "could not be asked"):
// the words before it stay, the quoted text goes.
var errorTexts = regexp.MustCompile(`(no usable answer from [a-z_]+): [^\n]*`)

// quotedAfter are the words after which recovery quotes an error in
// parentheses — an error whose text may hold parentheses and line breaks of
// its own (a 503's JSON body), so the quote ends at the matching one.
var quotedAfter = []string{"could not be asked (", "its deadline had passed ("}

// customerText is free text as a customer reads it: without the error
// texts it quotes and without addresses.
func customerText(s string) string {
	for _, words := range quotedAfter {
		s = withoutQuote(s, words)
	}
	return redactAddresses(errorTexts.ReplaceAllString(s, "$1"))
}

// withoutQuote is s with every parenthesised text after words taken out,
// up to its matching parenthesis (to the end when there is none).
func withoutQuote(s, words string) string {
	for from := 0; ; {
		i := strings.Index(s[from:], words)
		if i < 0 {
			return s
		}
		open := from + i + len(words) - 1 // the "("
		end, depth := len(s), 0
		for j := open; j < len(s); j++ {
			if s[j] == '(' {
				depth++
			} else if s[j] == ')' {
				if depth--; depth == 0 {
					end = j + 1
					break
				}
			}
		}
		s = s[:open-1] + s[end:]
		from = open - 1
	}
}

// addresses are what must not reach a customer in free text: URLs and
// host:port pairs (the provider's internal address, above all).
var addresses = regexp.MustCompile(`"?\b[a-z][a-z0-9+.-]*://[^\s"]+"?|\[[0-9a-fA-F:]+\]:\d+|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\blocalhost:\d+\b`)

// redactAddresses replaces every address in s with "the provider".
func redactAddresses(s string) string {
	return addresses.ReplaceAllString(s, "the provider")
}

// customerTimeline is a timeline with addresses taken out of its details
// and owner tokens out of its lines and their statements' values.
func customerTimeline(events []readmodel.Event) []readmodel.Event {
	out := make([]readmodel.Event, len(events))
	for i, e := range events {
		e.Detail = customerText(e.Detail)
		e.OwnerToken, e.Actor = nil, customerActor(e.Actor)
		out[i] = e
	}
	return out
}

// howFailed says how step name of op ended FAILED: "refused" (its system
// said REJECTED), "never received" (NOT_STARTED once every deadline had
// passed) or "a person" (marked failed on the desk); "" when it did not fail.
func howFailed(op workflow.Operation, name string) string {
	st, ok := op.Step(name)
	if !ok || st.State != workflow.StepFailed {
		return ""
	}
	var answer map[string]any
	if json.Unmarshal(st.Answer, &answer) == nil && (answer["decided_by"] != nil || answer["decision"] != nil) {
		return "a person"
	}
	if st.Truth != nil && *st.Truth == string(external.TruthNotStarted) {
		return "never received"
	}
	return "refused"
}

// depositNotCharged says why a deposit booking ended FAILED, in a
// customer's words: the booking page and the answer's summary say the same.
func depositNotCharged(op workflow.Operation) string {
	switch howFailed(op, slots.StepChargeDeposit) {
	case "never received":
		return "The payments service never received the deposit's charge"
	case "a person":
		return "A person found the deposit was not charged"
	}
	return "The deposit was declined"
}

// whyNotDone is a customer's summary where the status alone would give the
// wrong reason (the fresh reader's finding 10: "declined" for a charge never
// received, "refused" for a cancellation a person marked failed, "could
// not be confirmed" for a refund payments refused); "" where it would not.
func whyNotDone(op workflow.Operation) string {
	switch {
	case op.Type == slots.OperationBookDeposit && op.Status == workflow.StatusFailed:
		return depositNotCharged(op) + ", so the hold was released. Nothing was charged; you may try again."
	case op.Type == policies.OperationCancel && op.Status == workflow.StatusFailed && howFailed(op, policies.StepProviderCancel) == "a person":
		return "A person marked this cancellation failed, on their finding that the provider never cancelled the policy; nothing was changed here. You may try again."
	case op.Type == policies.OperationCancel && op.Status == workflow.StatusNeedsReconciliation && howFailed(op, policies.StepRefund) == "refused":
		return "The policy is cancelled; payments refused the refund, and a person is seeing to it."
	}
	return ""
}

// customerDetail is the operation page (and its htmx panel) as a customer
// reads it: the same rule as the API's, carried to what only the page adds.
// The summary stands in for every error text (a failed status query, a
// system that could not be asked just now); the teaching apparatus — SQL,
// the statements' and the keys' code locations, the steps' raw requests and
// answers, owner tokens — are the operators'. The customer keeps what
// happened and when. (Actors lost their instance in customerOperation,
// customerTimeline and customerCalls: the API's rule.)
func customerDetail(vm views.OperationDetail) views.OperationDetail {
	ids := make([]views.Identity, len(vm.Identities))
	for i, id := range vm.Identities {
		id.Code, id.CodeHref = "", ""
		ids[i] = id
	}
	vm.Identities = ids
	steps := make([]views.Step, len(vm.Steps))
	for i, s := range vm.Steps {
		s.Request, s.Answer, s.TraceID = "", "", ""
		if s.LiveError != "" {
			s.LiveError = "no usable answer"
		}
		steps[i] = s
	}
	vm.Steps = steps
	calls := make([]views.CallLine, len(vm.Calls))
	for i, c := range vm.Calls {
		if c.Error != "" {
			c.Error = "no usable answer"
		}
		c.What = customerWords(c.What)
		calls[i] = c
	}
	vm.Calls = calls
	timeline := make([]views.TimelineEvent, len(vm.Timeline))
	for i, e := range vm.Timeline {
		e.Owner, e.Detail = "", customerWords(e.Detail)
		e.StatementName, e.Statement, e.StatementHref, e.StatementWhere = "", "", "", ""
		timeline[i] = e
	}
	vm.Timeline = timeline
	return vm
}

// onInstance is the instance an actor names ("request 7f3a on app-2",
// "recovery on vm", "admin (request 7f3a on app-1)"): which replica did it
// is the operators' business. A closing parenthesis stays.
var onInstance = regexp.MustCompile(` on [^\s)]+(\)?)$`)

// customerActor is an actor without the instance it ran on.
func customerActor(s string) string { return onInstance.ReplaceAllString(s, "$1") }

// rawInWords are what free text on a page may still quote after
// customerText: a JSON object (a request or an answer) and an HTTP status.
var rawInWords = regexp.MustCompile(`\s*\{[^\n]*\}|\s*\(?HTTP \d{3}[^)\n]*\)?`)

// customerWords is a page's free text as a customer reads it: customerText,
// then without the JSON or HTTP status it quotes.
func customerWords(s string) string {
	return rawInWords.ReplaceAllString(customerText(s), "")
}
