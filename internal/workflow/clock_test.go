package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/recovery/recoverytest"
	"github.com/idemlab/idemlab/internal/workflow"
)

// A step's times are its calls' times (issue 29's second read, finding 8:
// the operation page showed a step "Sent" and "Finished" before the calls
// that made them). sent_at is the instant its call's row was recorded, and
// finished_at its answer's; each step is sent after the answer before it
// was recorded, and the operation finishes after its last step. Before, the
// step's times were now() — the transaction's start, and the transaction
// that records an answer also sends the next step — while a call's row took
// clock_timestamp().
func TestStepTimesAreTheirCallsTimes(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	b.PatientRequests(t, b.Timeout)
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true})
	pid := b.PolicyIDs[0]
	op, err := b.Canceller.Cancel(context.Background(), policies.CancelRequest{UserID: b.Alice, PolicyID: pid,
		RequestKey: "clock", Actor: "request on app-1"}, workflow.Hooks[workflow.Operation]{})
	if err != nil || op.Status != workflow.StatusSucceeded {
		t.Fatalf("cancel: %+v %v", op, err)
	}
	rows, err := b.DB.Pool.Query(context.Background(), `
		SELECT s.name, s.sent_at, s.finished_at, c.at, a.at
		  FROM operation_steps s
		  JOIN operation_calls c ON c.step_key = s.step_key AND c.kind = 'call'
		  JOIN operation_calls a ON a.call_id = c.id AND a.kind = 'answer'
		 WHERE s.operation_id = $1
		 ORDER BY s.position`, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lastAnswer time.Time
	n := 0
	for rows.Next() {
		var name string
		var sent, finished, called, answered time.Time
		if err := rows.Scan(&name, &sent, &finished, &called, &answered); err != nil {
			t.Fatal(err)
		}
		n++
		if !sent.Equal(called) || !finished.Equal(answered) {
			t.Errorf("%s: sent %s, its call recorded %s; finished %s, its answer recorded %s",
				name, sent.Format(time.StampMicro), called.Format(time.StampMicro), finished.Format(time.StampMicro), answered.Format(time.StampMicro))
		}
		if sent.Before(lastAnswer) {
			t.Errorf("%s sent at %s, before the answer before it was recorded (%s)",
				name, sent.Format(time.StampMicro), lastAnswer.Format(time.StampMicro))
		}
		lastAnswer = answered
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d external steps answered, want provider_cancel and refund", n)
	}
	if op.FinishedAt == nil || op.FinishedAt.Before(lastAnswer) {
		t.Errorf("the operation finished at %v, before its last step's answer (%s)", op.FinishedAt, lastAnswer.Format(time.StampMicro))
	}
	recoverytest.CheckInvariants(t, b.DB)
}
