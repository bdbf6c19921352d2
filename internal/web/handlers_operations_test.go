package web

import (
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
)

// An operation page speaks of its own kind (issue 29, finding 19): a
// deposit booking is never "finished without cancelling", and its run is
// not "a cancellation asked for again".
func TestOperationWordsFollowItsKind(t *testing.T) {
	for _, tc := range []struct {
		typ              string
		policy           int64
		succeeded, faild string
		run              string
		never            []string
	}{
		{policies.OperationCancel, 1, "the policy is cancelled", "Finished without cancelling", "a cancellation asked for again", nil},
		{slots.OperationBookDeposit, 0, "the slot is booked", "Finished without booking", "one run",
			[]string{"cancel", "Cancel"}},
		{slots.OperationCancelDeposit, 0, "the deposit is refunded", "the booking stands", "refund was refused",
			[]string{"policy"}},
	} {
		op := workflow.Operation{Type: tc.typ, PolicyID: tc.policy}
		op.Status = workflow.StatusSucceeded
		done, _, _ := operationHeadline(op, time.Now())
		op.Status = workflow.StatusFailed
		failed, _, _ := operationHeadline(op, time.Now())
		run := runAgain(tc.typ)
		if !strings.Contains(done, tc.succeeded) || !strings.Contains(failed, tc.faild) || !strings.Contains(run, tc.run) {
			t.Errorf("%s: %q / %q / %q", tc.typ, done, failed, run)
		}
		for _, w := range tc.never {
			for _, s := range []string{done, failed, run} {
				if strings.Contains(s, w) {
					t.Errorf("%s says %q: %q", tc.typ, w, s)
				}
			}
		}
	}
}

// A booking's operation has one name on every page: its own page and the
// booking page (sagaKind) say what the Operations list says (kindWords)
// (issue 29's second read: "Deposit refund of …" on its page, "Deposit
// cancellation" in the list).
func TestABookingsOperationHasOneName(t *testing.T) {
	for _, typ := range []string{slots.OperationBookDeposit, slots.OperationCancelDeposit} {
		if sagaKind(typ) != kindWords(typ) {
			t.Errorf("%s: its page says %q, the list %q", typ, sagaKind(typ), kindWords(typ))
		}
	}
}

// A request key still in progress says until when its lease runs (issue
// 29's second read, finding 9): the operation page stops refreshing once
// the operation is final, and a crashed request's key outlives it, so
// "claimed and leased" with no time went stale under the reader's eyes.
func TestKeyStateSaysUntilWhen(t *testing.T) {
	at := time.Date(2026, 12, 4, 21, 40, 12, 0, time.UTC)
	for expired, want := range map[bool]string{false: "leased until 21:40:12 UTC", true: "its lease ran out at 21:40:12 UTC"} {
		got := keyLeaseState(&idempotency.Record{Status: idempotency.StatusInProgress, LeaseExpired: expired, LeaseExpiresAt: at})
		if !strings.Contains(got, want) || !strings.Contains(got, "takes") {
			t.Errorf("expired %t: %q, want %q and what a retry does", expired, got, want)
		}
	}
}

// The panel refreshes while recovery may still change the operation —
// live, and waiting for a person (recovery asks again, and may finish it)
// — and its page is loaded again when the state its forms were chosen for
// changes (panelShown).
func TestPanelRefreshesWhileTheOperationMayChange(t *testing.T) {
	for status, every := range map[string]string{workflow.StatusInProgress: "1s", workflow.StatusRecovering: "1s",
		workflow.StatusNeedsReconciliation: "5s", workflow.StatusSucceeded: "", workflow.StatusFailed: ""} {
		if got := refreshEvery(workflow.Operation{Status: status}); got != every {
			t.Errorf("%s refreshes every %q, want %q", status, got, every)
		}
	}
	live := workflow.Operation{Status: workflow.StatusInProgress, UpdatedAt: time.Now()}
	renewed := live
	renewed.UpdatedAt = live.UpdatedAt.Add(time.Second) // a lease renewed: the forms still fit
	cancelled, done := live, live
	cancelled.CancelRequestedAt = &renewed.UpdatedAt
	done.Status = workflow.StatusSucceeded
	if panelShown(live) != panelShown(renewed) || panelShown(live) == panelShown(cancelled) || panelShown(live) == panelShown(done) {
		t.Errorf("panelShown: %q %q %q %q", panelShown(live), panelShown(renewed), panelShown(cancelled), panelShown(done))
	}
}

// A person is awaited while recovery still asks (the fresh reader's finding
// 4: the header said "nothing more happens on its own until they decide"
// beside "still asks now and then, so it may finish on its own", and it
// did): with a re-ask due the header says when, and that it may finish on
// its own; a definite refusal, never asked again, still waits for a person.
func TestWaitingForAPersonSaysWhetherRecoveryStillAsks(t *testing.T) {
	sys, next := "provider", time.Date(2026, 12, 4, 21, 40, 12, 0, time.UTC)
	op := workflow.Operation{Status: workflow.StatusNeedsReconciliation, NextAttemptAt: &next, Steps: []workflow.StepRecord{
		{Name: "record_intent", State: workflow.StepDone},
		{Name: "provider_cancel", System: &sys, State: workflow.StepUnknown},
	}}
	asks, _, _ := operationHeadline(op, time.Now())
	if strings.Contains(asks, "nothing more happens") || !strings.Contains(asks, "next at 21:40:12") || !strings.Contains(asks, "on its own") {
		t.Errorf("a re-ask due: %q", asks)
	}
	op.NextAttemptAt = nil
	op.Steps[1].State = workflow.StepFailed
	if refused, _, _ := operationHeadline(op, time.Now()); !strings.Contains(refused, "Nothing more happens on its own") {
		t.Errorf("a refusal: %q", refused)
	}
}

// A customer is told the reason that happened (the fresh reader's finding
// 10): a deposit whose charge payments never received was "declined", a
// cancellation a person marked failed was "refused", a refund payments
// refused "could not be confirmed".
func TestCustomersAreToldTheReasonThatHappened(t *testing.T) {
	truth := func(s string) *string { return &s }
	payments, provider, failed := "payments", "provider", "failed"
	for _, tc := range []struct {
		op         workflow.Operation
		want, not  string
		headlineIs string
	}{
		{workflow.Operation{Type: slots.OperationBookDeposit, Status: workflow.StatusFailed, LastError: &failed, Steps: []workflow.StepRecord{
			{Name: slots.StepChargeDeposit, System: &payments, State: workflow.StepFailed, Truth: truth("NOT_STARTED")}}},
			"never received the deposit's charge", "declined", ""},
		{workflow.Operation{Type: slots.OperationBookDeposit, Status: workflow.StatusFailed, LastError: &failed, Steps: []workflow.StepRecord{
			{Name: slots.StepChargeDeposit, System: &payments, State: workflow.StepFailed, Truth: truth("REJECTED")}}},
			"The deposit was declined", "never received", ""},
		{workflow.Operation{Type: policies.OperationCancel, PolicyID: 1, Status: workflow.StatusFailed, LastError: &failed, Steps: []workflow.StepRecord{
			{Name: policies.StepProviderCancel, System: &provider, State: workflow.StepFailed, Truth: truth("NOT_STARTED"),
				Answer: []byte(`{"decided_by": "admin", "decision": "mark_failed", "note": ""}`)}}},
			"A person marked this cancellation failed", "refused", "a person marked it failed, on their finding"},
		{workflow.Operation{Type: policies.OperationCancel, PolicyID: 1, Status: workflow.StatusNeedsReconciliation, LastError: &failed, Steps: []workflow.StepRecord{
			{Name: policies.StepProviderCancel, System: &provider, State: workflow.StepDone, Truth: truth("COMPLETED")},
			{Name: policies.StepRefund, System: &payments, State: workflow.StepFailed, Truth: truth("REJECTED")}}},
			"payments refused the refund", "could not be confirmed", ""},
	} {
		got := *customerOperation(tc.op).LastError
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
			t.Errorf("%s %s: %q, want %q and not %q", tc.op.Type, tc.op.Status, got, tc.want, tc.not)
		}
		if tc.headlineIs != "" {
			// The admin's page and the customer's (third read, finding 3: the
			// customer's said "it was refused" of a person's decision).
			for _, op := range []workflow.Operation{tc.op, customerOperation(tc.op)} {
				if h, _, _ := operationHeadline(op, time.Now()); !strings.Contains(h, tc.headlineIs) || strings.Contains(h, "refused") {
					t.Errorf("headline %q", h)
				}
			}
		}
	}
}

// Resume and Retry from say on whose word the step failed, and warn when
// nobody knows its call did not take effect (third read: a cancellation a
// person had marked failed, though the provider had applied it, was offered
// as "the other system refused it … never a repeat of the refused one";
// resuming cancelled it twice).
func TestResumeSaysOnWhoseWordTheStepFailed(t *testing.T) {
	sys, rejected, notStarted, unknown := "provider", "REJECTED", "NOT_STARTED", "UNKNOWN"
	done := workflow.StepRecord{Name: "record_intent", State: workflow.StepDone}
	for _, tc := range []struct {
		name   string
		step   workflow.StepRecord
		unsure bool
		says   string
	}{
		{"refused", workflow.StepRecord{Name: "provider_cancel", System: &sys, State: workflow.StepFailed, Truth: &rejected}, false, "refused provider_cancel"},
		{"never took effect", workflow.StepRecord{Name: "provider_cancel", System: &sys, State: workflow.StepFailed, Truth: &notStarted}, false, "known never to have taken effect"},
		{"a person's, outcome unknown", workflow.StepRecord{Name: "provider_cancel", System: &sys, State: workflow.StepUnknown, Truth: &unknown}, true, "a person (or a cancel) stopped it"},
		{"a person's, never asked", workflow.StepRecord{Name: "provider_cancel", System: &sys, State: workflow.StepSent}, true, "a person (or a cancel) stopped it"},
		{"cancelled before it", workflow.StepRecord{Name: "mark_cancelled", State: workflow.StepCancelled}, false, "cancelled before mark_cancelled"},
	} {
		why, unsure := stoppedOn(workflow.Operation{Steps: []workflow.StepRecord{done, tc.step}})
		if unsure != tc.unsure || !strings.Contains(why, tc.says) || strings.Contains(why, "refused") != (tc.name == "refused") {
			t.Errorf("%s: %q (unsure %v); want %q, unsure %v", tc.name, why, unsure, tc.says, tc.unsure)
		}
	}
}

// A person's "mark failed" stays theirs on the page, and when the system's
// truth now says otherwise (invariant 4 names the operation) the headline
// says what the provider says, rather than that a person "found" anything
// (third read, finding 3: "a person found the provider never applied it"
// under the banner saying it had).
func TestAPersonsMarkFailedIsTheirsAndTheProviderIsHeard(t *testing.T) {
	op := workflow.Operation{ID: 6, Type: policies.OperationCancel, PolicyID: 22, Status: workflow.StatusFailed}
	broken := []invariants.Violation{{Invariant: 4, IDs: []int64{3, 6}}}
	if got := appliedAfterAll(op, broken); !strings.Contains(got, "The provider says it did apply it") {
		t.Errorf("invariant 4 names op 6: %q", got)
	}
	if got := appliedAfterAll(op, []invariants.Violation{{Invariant: 4, IDs: []int64{7}}, {Invariant: 1, IDs: []int64{6}}}); got != "" {
		t.Errorf("invariant 4 does not name op 6: %q", got)
	}
}

// One truth about a cancel after another system's effect, in the notice
// right after pressing Cancel and on the page once the operation waits for
// a person (third read, finding 4: the notice promised the provider's
// cancellation "is undone if it went through"; the page later said it
// "cannot be undone automatically"). Only a definition with a Compensation
// (a deposit booking) undoes it.
func TestACancelAfterAnEffectIsToldOneWay(t *testing.T) {
	asked := time.Now()
	live := workflow.Operation{Type: policies.OperationCancel, PolicyID: 1, Status: workflow.StatusInProgress, CancelRequestedAt: &asked}
	waits := live
	waits.Status = workflow.StatusNeedsReconciliation
	for _, op := range []workflow.Operation{live, waits} {
		if got := cancelState(op); !strings.Contains(got, cancelledTooLate) || strings.Contains(got, "undone if") {
			t.Errorf("%s: %q, want %q", op.Status, got, cancelledTooLate)
		}
	}
	deposit := live
	deposit.Type, deposit.PolicyID = slots.OperationBookDeposit, 0
	if got := cancelState(deposit); !strings.Contains(got, "refunded") {
		t.Errorf("deposit booking: %q", got)
	}
}

// An actor loses its instance for a customer, and keeps its parentheses
// (fourth read: "admin (request 20bed… " never closed).
func TestCustomerActorKeepsItsParentheses(t *testing.T) {
	for in, want := range map[string]string{
		"request 7f3a on app-2":         "request 7f3a",
		"recovery on vm":                "recovery",
		"admin (request 7f3a on app-1)": "admin (request 7f3a)",
		"admin":                         "admin",
	} {
		if got := customerActor(in); got != want {
			t.Errorf("customerActor(%q) = %q, want %q", in, got, want)
		}
	}
}
