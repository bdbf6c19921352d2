package reconciliation

import (
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/workflow"
)

// A refused step's truth agrees with its reason (issue 29, finding 6): the
// refund payments refused definitely is REJECTED then and now — counted so
// by the truth filter — before anyone asks, and after a question that got
// no answer; only a question that *answers* changes the truth now.
func TestARefusalStaysTheTruthUntilAnAnswerSaysOtherwise(t *testing.T) {
	t.Parallel()
	payments, rejected, completed := "payments", string(external.TruthRejected), string(external.TruthCompleted)
	handed := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)
	deadline := handed.Add(-time.Second)
	refusedItem := func(calls ...readmodel.CallRecord) *Item {
		return &Item{
			Operation:  workflow.Operation{ID: 7, Type: "CANCEL", Status: workflow.StatusNeedsReconciliation},
			Stuck:      workflow.StepRecord{Name: "refund", Key: "7:refund", System: &payments, State: workflow.StepFailed, DeadlineAt: &deadline},
			HandedOver: handed,
			Calls: append([]readmodel.CallRecord{
				{ID: 1, StepKey: "7:refund", Kind: "call", System: payments, At: handed.Add(-2 * time.Second), DeadlineAt: &deadline},
				{ID: 2, StepKey: "7:refund", Kind: "answer", System: payments, At: handed.Add(-time.Second), Truth: &rejected},
			}, calls...),
		}
	}
	for _, tc := range []struct {
		name      string
		item      *Item
		truth     string // Item.Truth: what the filter counts
		now, then string // the card's lines start so
		nowSays   string
	}{
		{"not asked since", refusedItem(), rejected, "REJECTED:", "REJECTED:", "has not been asked since"},
		{"asked, no answer", refusedItem(readmodel.CallRecord{ID: 3, StepKey: "7:refund", Kind: "status", System: payments,
			At: handed.Add(time.Minute), Detail: "payments: status 7:refund: unexpected HTTP status 503"}),
			rejected, "REJECTED:", "REJECTED:", "no answer does not undo a refusal"},
		{"a status query before the hand-over failed", refusedItem(readmodel.CallRecord{ID: 3, StepKey: "7:refund", Kind: "status", System: payments,
			At: handed.Add(-time.Millisecond), Detail: "connection refused"}),
			rejected, "REJECTED:", "REJECTED:", "has not been asked since"},
		{"asked, answered otherwise", refusedItem(readmodel.CallRecord{ID: 3, StepKey: "7:refund", Kind: "status", System: payments,
			At: handed.Add(time.Minute), Truth: &completed}),
			completed, "COMPLETED:", "REJECTED:", "when asked at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := tc.item
			it.Facts = readFacts(Config{MaxAttempts: 5}, it, map[string]bool{payments: false}, false)
			it.Advice = Advise(it.Facts)
			if it.Facts.Reason != ReasonRefused {
				t.Fatalf("reason %s, want refused", it.Facts.Reason)
			}
			if got := it.Truth(); got != tc.truth {
				t.Errorf("truth now %s, want %s (the filter would count it elsewhere)", got, tc.truth)
			}
			if !strings.HasPrefix(it.Advice.Then, tc.then) || !strings.HasPrefix(it.Advice.Now, tc.now) || !strings.Contains(it.Advice.Now, tc.nowSays) {
				t.Errorf("then %q, now %q; want %s… / %s… saying %q", it.Advice.Then, it.Advice.Now, tc.then, tc.now, tc.nowSays)
			}
			card := it.Advice.Why + " " + it.Advice.Then + " " + it.Advice.Now
			if strings.Contains(card, "says nothing about whether") || strings.Contains(card, TruthUnknown) {
				t.Errorf("a definite refusal reads as unknown: %q", card)
			}
		})
	}
}
