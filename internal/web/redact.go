package web

import (
	"regexp"

	"github.com/idemlab/idemlab/internal/policies"
)

// What a customer may read of an operation. The error texts the workflow
// and recovery record are written for the people who run the system: they
// name the provider's address, a transport's error, a status code. A
// customer gets, instead of last_error, a sentence about what the status
// means for them, and timelines with addresses taken out; an admin sees
// every text as recorded.

// customerSummaries replace last_error for a customer, by status.
var customerSummaries = map[string]string{
	policies.OpInProgress:          "The provider's answer is not known yet; the cancellation will be finished automatically.",
	policies.OpRecovering:          "The provider's answer is not known yet; the cancellation is being finished automatically.",
	policies.OpFailed:              "The provider refused the cancellation. You may try again.",
	policies.OpNeedsReconciliation: "The provider's answer could not be confirmed; a person is checking it.",
}

// customerOperation is op as its customer sees it.
func customerOperation(op policies.Operation) policies.Operation {
	if op.LastError != nil {
		s, ok := customerSummaries[op.Status]
		if !ok {
			s = "The provider had a problem with this cancellation."
		}
		op.LastError = &s
	}
	return op
}

// addresses are what must not reach a customer in free text: URLs and
// host:port pairs (the provider's internal address, above all).
var addresses = regexp.MustCompile(`"?\b[a-z][a-z0-9+.-]*://[^\s"]+"?|\[[0-9a-fA-F:]+\]:\d+|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\blocalhost:\d+\b`)

// redactAddresses replaces every address in s with "the provider".
func redactAddresses(s string) string {
	return addresses.ReplaceAllString(s, "the provider")
}

// customerTimeline is a timeline with addresses taken out of its details.
func customerTimeline(events []policies.Event) []policies.Event {
	out := make([]policies.Event, len(events))
	for i, e := range events {
		e.Detail = redactAddresses(e.Detail)
		out[i] = e
	}
	return out
}
