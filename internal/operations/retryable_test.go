package operations

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/workflow"
)

// nobody is a Caller that is never called: the rule reads definitions, not
// systems.
type nobody struct{}

func (nobody) System() string { return "payments" }
func (nobody) Request(context.Context, pgx.Tx, workflow.Operation) (any, error) {
	return nil, nil
}
func (nobody) Deadline() time.Time { return time.Time{} }
func (nobody) Send(context.Context, workflow.Call) (external.Result, error) {
	return external.Result{}, nil
}
func (nobody) Status(context.Context, string) (external.Truth, error) { return "", nil }

func local(context.Context, pgx.Tx, workflow.Operation) (string, error) { return "", nil }

// The rule of a retry from a step, case by case, on the shapes of idemlab's
// workflows: a cancellation (intent, a call whose refusal fails it, local
// steps, a call whose refusal waits for a person) and a deposit booking (a
// hold undone when the charge is refused, a compensation).
func TestRetryableFromOnlyWhereSafe(t *testing.T) {
	cancel := workflow.Definition{Type: "CANCEL", Steps: []workflow.Step{
		{Name: "intent"},
		{Name: "provider", Call: nobody{}, Refused: workflow.FailOperation},
		{Name: "mark", Do: local},
		{Name: "refund", Call: nobody{}, Refused: workflow.Reconcile},
		{Name: "audit", Do: local},
	}}
	deposit := workflow.Definition{Type: "BOOK", Steps: []workflow.Step{
		{Name: "hold", Undo: local},
		{Name: "charge", Call: nobody{}},
		{Name: "confirm", Do: local},
	}, Compensation: []workflow.Step{{Name: "refund_charge", Call: nobody{}}}}
	op := func(typ, status string, states ...string) workflow.Operation {
		names := map[string][]string{"CANCEL": {"intent", "provider", "mark", "refund", "audit"},
			"BOOK": {"hold", "charge", "confirm", "refund_charge"}}[typ]
		o := workflow.Operation{Type: typ, Status: status}
		for i, st := range states {
			o.Steps = append(o.Steps, workflow.StepRecord{Position: i + 1, Name: names[i], State: st})
		}
		return o
	}
	for _, tc := range []struct {
		name string
		def  workflow.Definition
		op   workflow.Operation
		step string
		want error // nil: allowed
	}{
		{"a refused refund, the provider's cancel standing", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "DONE", "FAILED", "PENDING"), "refund", nil},
		{"a refused provider call (a resume would do the same)", cancel,
			op("CANCEL", workflow.StatusFailed, "DONE", "FAILED", "PENDING", "PENDING", "PENDING"), "provider", nil},
		{"stopped by a cancel before anything was sent", cancel,
			op("CANCEL", workflow.StatusFailed, "DONE", "CANCELLED", "CANCELLED", "CANCELLED", "CANCELLED"), "provider", nil},
		{"handed to a person after a cancel, at a local step", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "PENDING", "PENDING", "PENDING"), "mark", nil},
		{"an unknown outcome", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "DONE", "UNKNOWN", "PENDING"), "refund", ErrRetryStepUnknown},
		{"a step sent, no answer yet", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "DONE", "SENT", "PENDING"), "refund", ErrRetryStepUnknown},
		{"a step that took effect", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "DONE", "FAILED", "PENDING"), "provider", ErrRetryStepTookEffect},
		{"a step after the one it stopped at", cancel,
			op("CANCEL", workflow.StatusNeedsReconciliation, "DONE", "DONE", "DONE", "FAILED", "PENDING"), "audit", ErrRetryStepNotNext},
		{"the intent", cancel,
			op("CANCEL", workflow.StatusFailed, "DONE", "FAILED", "PENDING", "PENDING", "PENDING"), "intent", ErrRetryStepNotNext},
		{"no such step", cancel,
			op("CANCEL", workflow.StatusFailed, "DONE", "FAILED", "PENDING", "PENDING", "PENDING"), "charge", ErrRetryNoSuchStep},
		{"live", cancel,
			op("CANCEL", workflow.StatusInProgress, "DONE", "SENT", "PENDING", "PENDING", "PENDING"), "provider", ErrRetryNotStopped},
		{"recovering", cancel,
			op("CANCEL", workflow.StatusRecovering, "DONE", "UNKNOWN", "PENDING", "PENDING", "PENDING"), "provider", ErrRetryNotStopped},
		{"finished", cancel,
			op("CANCEL", workflow.StatusSucceeded, "DONE", "DONE", "DONE", "DONE", "DONE"), "refund", ErrRetryNotStopped},
		{"a refused charge: the hold was released", deposit,
			op("BOOK", workflow.StatusFailed, "DONE", "FAILED", "PENDING"), "charge", ErrRetryAfterUndo},
		{"cancelled and compensated", deposit,
			op("BOOK", workflow.StatusNeedsReconciliation, "DONE", "DONE", "CANCELLED", "FAILED"), "confirm", ErrRetryAfterUndo},
		{"a compensation", deposit,
			op("BOOK", workflow.StatusNeedsReconciliation, "DONE", "DONE", "CANCELLED", "FAILED"), "refund_charge", ErrRetryStepNotNext},
	} {
		err := retryableFrom(tc.def, tc.op, tc.step)
		var refusal *RetryRefusal
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		case tc.want != nil && (!errors.As(err, &refusal) || refusal.Why == "" || refusal.Step != tc.step):
			t.Errorf("%s: %#v, want a RetryRefusal naming %s and why", tc.name, err, tc.step)
		}
	}
}
