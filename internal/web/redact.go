package web

import (
	"encoding/json"
	"regexp"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
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

// customerOperation is op as its customer sees it: the summary for its
// status instead of last_error, addresses out of its steps' answers, and
// no owner token (the fence is the operators' business, not a customer's).
func customerOperation(op workflow.Operation) workflow.Operation {
	op.OwnerToken = nil
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
		op.LastError = &s
	}
	steps := make([]workflow.StepRecord, len(op.Steps))
	for i, st := range op.Steps {
		st.Answer = redactJSON(st.Answer)
		steps[i] = st
	}
	op.Steps = steps
	return op
}

// customerCalls is the log of calls with addresses taken out.
func customerCalls(calls []workflow.CallRecord) []workflow.CallRecord {
	out := make([]workflow.CallRecord, len(calls))
	for i, c := range calls {
		c.Detail = redactAddresses(c.Detail)
		c.OwnerToken = nil
		out[i] = c
	}
	return out
}

// redactJSON takes addresses out of the strings of a JSON document.
func redactJSON(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return raw
	}
	var v map[string]any
	if json.Unmarshal(raw, &v) != nil {
		return raw
	}
	for k, x := range v {
		if s, ok := x.(string); ok {
			v[k] = redactAddresses(s)
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return raw
	}
	return b
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
func customerTimeline(events []workflow.Event) []workflow.Event {
	out := make([]workflow.Event, len(events))
	for i, e := range events {
		e.Detail = redactAddresses(e.Detail)
		e.OwnerToken = nil
		out[i] = e
	}
	return out
}
