package check

import (
	"encoding/json"
	"fmt"

	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// answerBody is what the checks read from a final answer: an operation or
// a booking (id, status), or a problem naming an operation.
type answerBody struct {
	ID          int64  `json:"id"`
	Status      string `json:"status"`
	OperationID int64  `json:"operation_id"`
}

func parse(a *history.Attempt) answerBody {
	var b answerBody
	json.Unmarshal(a.Body, &b)
	return b
}

// Meaning: the final answer of each intent says something about the world,
// and the end state must agree with it.
func Meaning(intents []history.Intent, _ []history.Fault, end EndState) []Violation {
	released := releases(intents)
	var vs []Violation
	for i := range intents {
		in := &intents[i]
		a := in.FinalAnswer()
		if a == nil {
			continue // Answered reports it
		}
		var problem string
		switch in.Kind {
		case history.Cancel:
			problem = cancelMeaning(in, a, end)
		case history.Book:
			problem = bookMeaning(in, a, end, released[in.ID])
		case history.Release:
			problem = releaseMeaning(in, a, end)
		case history.Stop:
			problem = stopMeaning(in, a, end)
		}
		if problem != "" {
			vs = append(vs, violation("meaning", in, "%s", problem))
		}
	}
	return vs
}

// cancelMeaning: 200 → the operation SUCCEEDED and the policy is
// CANCELLED; 202 → the operation was finished by recovery, and the policy
// agrees with how; 422 provider-rejected → FAILED, the policy ACTIVE. A
// duplicate-intent is wrong here: no other key of the run cancels this
// policy.
func cancelMeaning(in *history.Intent, a *history.Attempt, end EndState) string {
	b := parse(a)
	policy := end.Policies[in.Subject]
	switch {
	case a.Status == 200 || a.Status == 202:
		op, ok := end.Operations[b.ID]
		switch {
		case !ok:
			return fmt.Sprintf("answered %s for operation %d, which does not exist", a.Label(), b.ID)
		case op.PolicyID != in.Subject:
			return fmt.Sprintf("answered %s for operation %d of policy %d", a.Label(), b.ID, op.PolicyID)
		case a.Status == 200 && b.Status != "SUCCEEDED":
			return fmt.Sprintf("answered 200 with the operation %s", b.Status)
		case a.Status == 200 && op.Status != "SUCCEEDED":
			return fmt.Sprintf("answered 200 SUCCEEDED; the operation ended %s", op.Status)
		case op.Status == "SUCCEEDED" && policy != "CANCELLED":
			return fmt.Sprintf("the operation SUCCEEDED; the policy is %s", policy)
		case op.Status == "FAILED" && policy != "ACTIVE":
			return fmt.Sprintf("the operation FAILED; the policy is %s", policy)
		case op.Status == "IN_PROGRESS" || op.Status == "RECOVERING":
			return fmt.Sprintf("the operation is still %s after the drain", op.Status)
		}
	case a.Status == 422 && a.Problem == "provider-rejected":
		op, ok := end.Operations[b.OperationID]
		switch {
		case !ok:
			return fmt.Sprintf("rejected, naming operation %d, which does not exist", b.OperationID)
		case op.Status != "FAILED":
			return fmt.Sprintf("answered provider-rejected; the operation is %s", op.Status)
		case policy != "ACTIVE":
			return fmt.Sprintf("answered provider-rejected; the policy is %s", policy)
		}
	case a.Status == 409 && a.Problem == "duplicate-intent":
		if op, ok := end.Operations[b.OperationID]; ok && op.Key == in.Key {
			return fmt.Sprintf("refused as a duplicate of operation %d — which this very key started", b.OperationID)
		}
		return fmt.Sprintf("refused as a duplicate of operation %d, but no other key of the run cancels this policy", b.OperationID)
	default:
		return "unexpected answer " + a.Label()
	}
	return ""
}

// bookMeaning: 201 → the booking exists, is this customer's, for this
// slot, and is CANCELLED exactly when a release of it was answered 200.
// 409 slot-taken is checked by Orphans (a booking made but not answered).
func bookMeaning(in *history.Intent, a *history.Attempt, end EndState, releasedOK bool) string {
	switch {
	case a.Status == 201:
		b := parse(a)
		bk, ok := end.Bookings[b.ID]
		switch {
		case !ok:
			return fmt.Sprintf("answered 201 booking %d, which does not exist", b.ID)
		case bk.User != in.User || bk.SlotID != in.Subject:
			return fmt.Sprintf("answered 201 booking %d, which is %s's booking of slot %d", b.ID, bk.User, bk.SlotID)
		case releasedOK && bk.Status != "CANCELLED":
			return fmt.Sprintf("booking %d was released (200) but is %s", b.ID, bk.Status)
		case !releasedOK && bk.Status != "CONFIRMED":
			return fmt.Sprintf("booking %d was never released but is %s", b.ID, bk.Status)
		}
	case a.Status == 409 && a.Problem == "slot-taken":
	default:
		return "unexpected answer " + a.Label()
	}
	return ""
}

// releaseMeaning: 200 → the booking is CANCELLED. A 409
// booking-not-confirmed is wrong here: each booking is released once, by
// one key, so "already released" means the key forgot it had done it.
func releaseMeaning(in *history.Intent, a *history.Attempt, end EndState) string {
	switch {
	case a.Status == 200:
		if bk, ok := end.Bookings[in.Subject]; !ok || bk.Status != "CANCELLED" {
			return fmt.Sprintf("answered 200; booking %d is %q", in.Subject, bk.Status)
		}
	case a.Status == 409 && a.Problem == "booking-not-confirmed":
		return fmt.Sprintf("booking %d released by this key alone, yet answered already released", in.Subject)
	default:
		return "unexpected answer " + a.Label()
	}
	return ""
}

// stopMeaning: an admin's cancel of a live operation. 202 → it was
// marked while live, so it never SUCCEEDED: every write that begins a step
// is fenced by the mark, the last one too — it ended FAILED (the policy
// ACTIVE: nothing done elsewhere, or undone) or waits for a person (what
// the provider did stands). 409 not-live → it had finished (or waited for
// a person) first. A cancel-already-requested is wrong here: each
// operation is stopped by one key.
func stopMeaning(in *history.Intent, a *history.Attempt, end EndState) string {
	op, ok := end.Operations[in.Subject]
	switch {
	case !ok:
		return fmt.Sprintf("stopped operation %d, which no answer named", in.Subject)
	case a.Status == 202 && op.Status == "FAILED" && end.Policies[op.PolicyID] != "ACTIVE":
		return fmt.Sprintf("marked cancelled (202); the operation FAILED, the policy is %s", end.Policies[op.PolicyID])
	case a.Status == 202 && op.Status != "FAILED" && op.Status != "NEEDS_RECONCILIATION":
		return fmt.Sprintf("marked cancelled (202); the operation ended %s", op.Status)
	case a.Status == 202, a.Status == 409 && a.Problem == "not-live":
	case a.Status == 409 && a.Problem == "cancel-already-requested":
		return fmt.Sprintf("operation %d stopped by this key alone, yet answered already requested", in.Subject)
	default:
		return "unexpected answer " + a.Label()
	}
	return ""
}

// releases says which book intents were undone by a release answered 200.
func releases(intents []history.Intent) map[int]bool {
	out := map[int]bool{}
	for i := range intents {
		in := &intents[i]
		if a := in.FinalAnswer(); in.Kind == history.Release && a != nil && a.Status == 200 {
			out[in.Parent] = true
		}
	}
	return out
}

// Orphans: every booking and every operation in the end state was
// answered to some client. A booking no 201 reported is an effect whose
// answer was lost and whose key forgot it (a retry then heard slot-taken);
// operations are compared by count, the app having no list of them.
func Orphans(intents []history.Intent, _ []history.Fault, end EndState) []Violation {
	answeredBookings := map[int64]bool{}
	answeredOps := map[int64]bool{}
	for i := range intents {
		in := &intents[i]
		a := in.FinalAnswer()
		if a == nil {
			continue
		}
		b := parse(a)
		switch {
		case in.Kind == history.Book && a.Status == 201:
			answeredBookings[b.ID] = true
		case in.Kind == history.Cancel && (a.Status == 200 || a.Status == 202):
			answeredOps[b.ID] = true
		case in.Kind == history.Cancel && b.OperationID != 0:
			answeredOps[b.OperationID] = true
		}
	}
	var vs []Violation
	for _, bk := range sortedBookings(end.Bookings) {
		if !answeredBookings[bk.ID] {
			vs = append(vs, Violation{Check: "orphans", Detail: fmt.Sprintf("booking %d (%s, slot %d, %s) was never answered to anyone", bk.ID, bk.User, bk.SlotID, bk.Status)})
		}
	}
	var total int64
	for _, n := range end.Invariants.Counts.OperationsByStatus {
		total += n
	}
	if extra := total - int64(len(answeredOps)); extra > 0 {
		vs = append(vs, Violation{Check: "orphans", Detail: fmt.Sprintf("%d operations exist that no answer named (%d operations, %d answered)", extra, total, len(answeredOps))})
	}
	return vs
}
