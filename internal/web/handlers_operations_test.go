package web

import (
	"strings"
	"testing"
	"time"

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
