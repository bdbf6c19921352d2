package views

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/workflow"
)

// TestALiveOperationNamesItsSubject: the recovery page's live list names a
// deposit saga's booking — it had shown such an operation as "policy 0".
func TestALiveOperationNamesItsSubject(t *testing.T) {
	v := RecoveryView{Live: []LiveOperation{
		{ID: 1, Subject: workflow.Operation{PolicyID: 3}.Subject(), Status: "IN_PROGRESS"},
		{ID: 2, Subject: workflow.Operation{BookingID: 7}.Subject(), Status: "RECOVERING"},
	}}
	var out bytes.Buffer
	if err := RecoveryPanel(v).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	html := out.String()
	for _, want := range []string{"policy 3", "booking 7"} {
		if !strings.Contains(html, want) {
			t.Errorf("the live list does not say %q", want)
		}
	}
	if strings.Contains(html, "policy 0") {
		t.Error(`the live list says "policy 0"`)
	}
}

// The operation page names its two counts apart: the operation's attempts
// (tries that ended without learning the outcome, the recovery budget) and
// each external step's calls sent (issue 29, second read, finding 10: both
// were "Attempts", 0 beside 1).
func TestOperationPageNamesAttemptsAndCallsApart(t *testing.T) {
	op := OperationDetail{ID: 7, Status: "SUCCEEDED", Run: 1, Attempts: 0, MaxAttempts: 5,
		Steps: []Step{{Position: 1, Name: "provider_cancel", System: "provider", State: "DONE", Attempts: 1}},
		Calls: []CallLine{{Kind: "call", System: "provider", Step: "provider_cancel", Attempt: " · call 1", What: "sent"}},
	}
	var out bytes.Buffer
	if err := OperationPage(Page{Title: "Operation 7"}, op).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	html := out.String()
	step := html[strings.Index(html, `data-testid="step-provider_cancel"`):]
	step = step[:strings.Index(step, "</dl>")]
	if regexp.MustCompile(`(?i)<dt>[^<]*attempt`).MatchString(step) {
		t.Errorf("a step's count is called an attempt, as the operation's is:\n%s", step)
	}
	if !strings.Contains(step, "Calls sent") {
		t.Errorf("the step does not say %q:\n%s", "Calls sent", step)
	}
	if !strings.Contains(html, "Run · attempts") {
		t.Error(`the operation's count is not "Run · attempts"`)
	}
	if strings.Contains(html, "Step · attempt") {
		t.Error(`the Calls table calls a step's call an attempt`)
	}
	// The explanation agrees with recovery (reader's findings 2 and 7): the
	// count is of the budget, and asking while waiting for a person uses none.
	explained := html[strings.Index(html, `data-testid="run-explained"`):]
	explained = explained[:strings.Index(explained, "</small>")]
	if !strings.Contains(explained, "Attempts 0 of 5") || strings.Contains(explained, "each question asked") ||
		!strings.Contains(explained, "without using an attempt") {
		t.Errorf("the attempts explained: %s", explained)
	}
}
