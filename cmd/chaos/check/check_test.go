package check

import (
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/internal/invariants"
)

// A clean history: a cancellation answered 200, a booking answered 201 and
// released, a booking refused slot-taken, each replayed identically; the
// end state agrees with every answer. Every check must pass on it, and
// each test below breaks it in one place and expects exactly its check to
// notice.

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func ans(status int, problem, body string) history.Attempt {
	return history.Attempt{Instance: "app-1", Sent: t0, Done: t0.Add(time.Millisecond), Status: status, Problem: problem, Body: []byte(body), RequestID: "r"}
}

func replayOf(a history.Attempt) history.Attempt { a.Replayed = true; return a }

func clean() ([]history.Intent, []history.Fault, EndState) {
	intents := []history.Intent{
		{ID: 1, Kind: history.Cancel, User: "u1", Key: "k1", Subject: 10, Attempts: []history.Attempt{
			{Instance: "app-2", Err: "timeout"},
			ans(200, "", `{"id":100,"status":"SUCCEEDED"}`),
		}},
		{ID: 2, Kind: history.Book, User: "u1", Key: "k2", Subject: 5, Attempts: []history.Attempt{
			ans(201, "", `{"id":7,"slot_id":5,"status":"CONFIRMED"}`),
		}},
		{ID: 3, Kind: history.Release, User: "u1", Key: "k3", Subject: 7, Parent: 2, Attempts: []history.Attempt{
			ans(503, "database-unavailable", `{}`),
			ans(200, "", `{"id":7,"status":"CANCELLED"}`),
		}},
		{ID: 4, Kind: history.Book, User: "u2", Key: "k4", Subject: 6, Attempts: []history.Attempt{
			ans(409, "request-in-progress", `{}`),
			ans(409, "slot-taken", `{"type":"slot-taken"}`),
		}},
		{ID: 5, Kind: history.Cancel, User: "u2", Key: "k5", Subject: 11, Attempts: []history.Attempt{
			ans(202, "", `{"id":101,"status":"IN_PROGRESS"}`),
		}},
		{ID: 6, Kind: history.Cancel, User: "u2", Key: "k6", Subject: 12, Attempts: []history.Attempt{
			ans(422, "provider-rejected", `{"operation_id":102}`),
		}},
	}
	end := EndState{
		Policies: map[int64]string{10: "CANCELLED", 11: "CANCELLED", 12: "ACTIVE"},
		Operations: map[int64]Operation{
			100: {ID: 100, PolicyID: 10, Status: "SUCCEEDED", Key: "k1"},
			101: {ID: 101, PolicyID: 11, Status: "SUCCEEDED", Key: "k5"},
			102: {ID: 102, PolicyID: 12, Status: "FAILED", Key: "k6"},
		},
		Bookings: map[int64]Booking{
			7: {ID: 7, SlotID: 5, Status: "CANCELLED", User: "u1"},
			8: {ID: 8, SlotID: 6, Status: "CONFIRMED", User: "u3"}, // u3 is another intent's
		},
		Replays:    map[int]history.Attempt{},
		Invariants: invariants.Report{OK: true, Counts: invariants.Counts{OperationsByStatus: map[string]int64{"SUCCEEDED": 2, "FAILED": 1}}},
		Effects:    map[int64]int{10: 1, 11: 1},
	}
	// Booking 8 is answered by an intent of user u3.
	intents = append(intents, history.Intent{ID: 7, Kind: history.Book, User: "u3", Key: "k7", Subject: 6, Attempts: []history.Attempt{
		ans(201, "", `{"id":8,"slot_id":6,"status":"CONFIRMED"}`),
	}})
	for i := range intents {
		end.Replays[intents[i].ID] = replayOf(*intents[i].FinalAnswer())
	}
	return intents, nil, end
}

// only asserts that exactly the named check reports, and that its detail
// mentions want.
func only(t *testing.T, vs []Violation, check, want string) {
	t.Helper()
	if len(vs) == 0 {
		t.Fatalf("no violation; want %s", check)
	}
	for _, v := range vs {
		if v.Check != check {
			t.Errorf("unexpected %s violation: %s", v.Check, v.Detail)
		}
	}
	if !strings.Contains(vs[0].Detail, want) {
		t.Errorf("%s: %q does not say %q", check, vs[0].Detail, want)
	}
}

func TestACleanHistoryPassesEveryCheck(t *testing.T) {
	intents, faults, end := clean()
	if vs := Run(intents, faults, end); len(vs) != 0 {
		for _, v := range vs {
			t.Errorf("%s: %s", v.Check, v.Detail)
		}
	}
}

func TestAnsweredFailsOnAnIntentWithoutAFinalAnswer(t *testing.T) {
	intents, faults, end := clean()
	intents[3].Attempts = intents[3].Attempts[:1] // only "in progress"
	delete(end.Replays, 4)
	only(t, Run(intents, faults, end), "answered", "no final answer after 1 attempts (409 request-in-progress)")
}

func TestAgreeFailsOnTwoAnswersForOneKey(t *testing.T) {
	intents, faults, end := clean()
	intents[1].Attempts = append(intents[1].Attempts, ans(409, "slot-taken", `{"type":"slot-taken"}`))
	only(t, Run(intents, faults, end), "agree", "two answers for one key: 201")
}

func TestAgreeComparesBytes(t *testing.T) {
	intents, faults, end := clean()
	intents[0].Attempts = append(intents[0].Attempts, ans(200, "", `{"id":100, "status":"SUCCEEDED"}`))
	only(t, Run(intents, faults, end), "agree", "two answers for one key")
}

func TestReplayFailsWhenTheStoredAnswerDiffers(t *testing.T) {
	intents, faults, end := clean()
	end.Replays[1] = replayOf(ans(409, "lease-lost", `{"type":"lease-lost"}`))
	only(t, Run(intents, faults, end), "replay", "the stored answer 409 lease-lost")
}

func TestReplayFailsWhenTheKeyExecutesAgain(t *testing.T) {
	intents, faults, end := clean()
	r := end.Replays[2]
	r.Replayed = false
	end.Replays[2] = r
	only(t, Run(intents, faults, end), "replay", "was not replayed")
}

func TestReplayFailsWhenNotReplayed(t *testing.T) {
	intents, faults, end := clean()
	delete(end.Replays, 6)
	end.Replays[5] = history.Attempt{Err: "connection refused"}
	vs := Replay(intents, faults, end)
	if len(vs) != 2 || !strings.Contains(vs[0].Detail, "no answer to the replay") || !strings.Contains(vs[1].Detail, "not replayed after the drain") {
		t.Fatalf("%+v", vs)
	}
}

func TestMeaningFailsWhenACancelledPolicyIsActive(t *testing.T) {
	intents, faults, end := clean()
	end.Policies[10] = "ACTIVE"
	only(t, Run(intents, faults, end), "meaning", "the operation SUCCEEDED; the policy is ACTIVE")
}

func TestMeaningFailsWhenA200OperationDidNotSucceed(t *testing.T) {
	intents, faults, end := clean()
	end.Operations[100] = Operation{ID: 100, PolicyID: 10, Status: "NEEDS_RECONCILIATION"}
	end.Policies[10] = "ACTIVE"
	only(t, Run(intents, faults, end), "meaning", "answered 200 SUCCEEDED; the operation ended NEEDS_RECONCILIATION")
}

func TestMeaningFailsWhenAHandedOverOperationIsStillLive(t *testing.T) {
	intents, faults, end := clean()
	end.Operations[101] = Operation{ID: 101, PolicyID: 11, Status: "RECOVERING"}
	end.Policies[11] = "ACTIVE"
	only(t, Run(intents, faults, end), "meaning", "still RECOVERING after the drain")
}

func TestMeaningFailsWhenARejectionLeftThePolicyCancelled(t *testing.T) {
	intents, faults, end := clean()
	end.Policies[12] = "CANCELLED"
	only(t, Run(intents, faults, end), "meaning", "answered provider-rejected; the policy is CANCELLED")
}

func TestMeaningFailsOnADuplicateOfItsOwnOperation(t *testing.T) {
	intents, faults, end := clean()
	a := ans(409, "duplicate-intent", `{"operation_id":100}`)
	intents[0].Attempts = []history.Attempt{a}
	end.Replays[1] = replayOf(a)
	only(t, Run(intents, faults, end), "meaning", "which this very key started")
}

func TestMeaningFailsWhenAReleasedBookingIsConfirmed(t *testing.T) {
	intents, faults, end := clean()
	end.Bookings[7] = Booking{ID: 7, SlotID: 5, Status: "CONFIRMED", User: "u1"}
	vs := Run(intents, faults, end)
	only(t, vs, "meaning", "booking 7 was released (200) but is CONFIRMED")
	if len(vs) != 2 { // the booking's meaning and the release's
		t.Fatalf("%+v", vs)
	}
}

func TestMeaningFailsWhenABookingIsSomeoneElses(t *testing.T) {
	intents, faults, end := clean()
	end.Bookings[7] = Booking{ID: 7, SlotID: 5, Status: "CANCELLED", User: "u9"}
	vs := Meaning(intents, faults, end)
	if len(vs) != 1 || !strings.Contains(vs[0].Detail, "which is u9's booking") {
		t.Fatalf("%+v", vs)
	}
}

func TestMeaningFailsOnAReleaseAnsweredAlreadyReleased(t *testing.T) {
	intents, faults, end := clean()
	a := ans(409, "booking-not-confirmed", `{}`)
	intents[2].Attempts = []history.Attempt{a}
	end.Replays[3] = replayOf(a)
	// Without a 200 release, booking 7 CANCELLED is also "never released".
	vs := Meaning(intents, faults, end)
	if len(vs) != 2 || !strings.Contains(vs[1].Detail, "yet answered already released") {
		t.Fatalf("%+v", vs)
	}
}

func TestOrphansFailsOnABookingNobodyWasTold(t *testing.T) {
	intents, faults, end := clean()
	end.Bookings[9] = Booking{ID: 9, SlotID: 6, Status: "CONFIRMED", User: "u2"}
	only(t, Run(intents, faults, end), "orphans", "booking 9 (u2, slot 6, CONFIRMED) was never answered")
}

func TestOrphansFailsOnAnOperationNoAnswerNamed(t *testing.T) {
	intents, faults, end := clean()
	end.Invariants.Counts.OperationsByStatus["SUCCEEDED"] = 3
	only(t, Run(intents, faults, end), "orphans", "1 operations exist that no answer named")
}

func TestNo500FailsOnA500EvenIfRetriedAway(t *testing.T) {
	intents, faults, end := clean()
	intents[0].Attempts = append([]history.Attempt{ans(500, "internal", `{}`)}, intents[0].Attempts...)
	only(t, Run(intents, faults, end), "no-500", "answered 500 on app-1")
}

func TestOwnAnswerFailsOnLeaseLostAndRefusedTokens(t *testing.T) {
	intents, faults, end := clean()
	intents[0].Attempts = append([]history.Attempt{ans(409, "lease-lost", `{}`), ans(401, "unauthenticated", `{}`)}, intents[0].Attempts...)
	vs := Run(intents, faults, end)
	only(t, vs, "own-answer", "answered 409 lease-lost")
	if len(vs) != 2 || !strings.Contains(vs[1].Detail, "a valid token refused") {
		t.Fatalf("%+v", vs)
	}
}

func TestInvariantsFailsOnTheAppsOwnVerdict(t *testing.T) {
	intents, faults, end := clean()
	end.Invariants.OK = false
	end.Invariants.Violations = []invariants.Violation{{Invariant: 1, Detail: "more than one provider effect for a policy", IDs: []int64{10}}}
	only(t, Run(intents, faults, end), "invariants", "invariant 1: more than one provider effect")
}

func TestExitsFailsOnAProcessThatEndedByItself(t *testing.T) {
	intents, _, end := clean()
	faults := []history.Fault{
		{Kind: history.Kill, Target: "app-1", Start: t0},
		{Kind: history.Exit, Target: "app-2", Start: t0, Detail: "exit status 1: database: ping"},
	}
	only(t, Run(intents, faults, end), "exits", "app-2 ended on its own")
}

func TestLastResortFailsOnAnOperationTheTruthSettles(t *testing.T) {
	intents, faults, end := clean()
	end.Waiting = []Operation{
		{ID: 103, PolicyID: 13, Truth: "RUNNING", Stuck: "provider_cancel", StuckState: "UNKNOWN", StuckTruth: "RUNNING"},
		{ID: 104, PolicyID: 14, Truth: "COMPLETED", Stuck: "provider_cancel", StuckState: "SENT", StuckTruth: "COMPLETED"},
		// The refund refused after the provider cancelled: a person's by design.
		{ID: 105, PolicyID: 15, Truth: "COMPLETED", Stuck: "refund", StuckState: "FAILED"},
	}
	vs := Run(intents, faults, end)
	only(t, vs, "last-resort", "operation 104 (policy 14) waits for a person at provider_cancel; its system says COMPLETED")
	if len(vs) != 1 {
		t.Fatalf("RUNNING is not conclusive, a refused refund is a person's: %+v", vs)
	}
}

func TestFinalSaysWhichAnswersEndAnIntent(t *testing.T) {
	for _, tc := range []struct {
		a     history.Attempt
		final bool
	}{
		{ans(200, "", ""), true},
		{ans(202, "", ""), true},
		{ans(409, "slot-taken", ""), true},
		{ans(422, "provider-rejected", ""), true},
		{ans(409, "request-in-progress", ""), false},
		{ans(409, "lease-lost", ""), false},
		{ans(401, "unauthenticated", ""), false},
		{ans(500, "internal", ""), false},
		{ans(503, "database-unavailable", ""), false},
		{history.Attempt{Err: "timeout"}, false},
	} {
		if got := tc.a.Final(); got != tc.final {
			t.Errorf("%s: Final() = %t", tc.a.Label(), got)
		}
	}
}

func TestKinds5xxNamesTheLoggedCause(t *testing.T) {
	intents := []history.Intent{{Attempts: []history.Attempt{
		{Status: 500, Problem: "internal", RequestID: "a"},
		{Status: 500, Problem: "internal", RequestID: "b"},
		{Status: 503, Problem: "database-unavailable", RequestID: "c"},
		{Status: 200},
	}}}
	got := Kinds5xx(intents, map[string]string{"a": "users: conn closed", "c": "ignored for a non-500"})
	want := map[string]int{"500 internal: users: conn closed": 1, "500 internal": 1, "503 database-unavailable": 1}
	if len(got) != len(want) {
		t.Fatalf("%v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%v", got)
		}
	}
}

// withStop adds an admin's stop of operation 101 (left live by intent 5's
// 202), answered a.
func withStop(intents []history.Intent, end EndState, a history.Attempt) []history.Intent {
	intents = append(intents, history.Intent{ID: 8, Kind: history.Stop, User: "admin", Key: "k8", Subject: 101, Parent: 5,
		Attempts: []history.Attempt{a}})
	end.Replays[8] = replayOf(a)
	return intents
}

func TestAStopThatEndedTheOperationFailedPasses(t *testing.T) {
	intents, faults, end := clean()
	intents = withStop(intents, end, ans(202, "", `{"id":101,"status":"IN_PROGRESS"}`))
	end.Operations[101] = Operation{ID: 101, PolicyID: 11, Status: "FAILED", Key: "k5"}
	end.Policies[11] = "ACTIVE"
	delete(end.Effects, 11)
	if vs := Run(intents, faults, end); len(vs) != 0 {
		t.Errorf("violations: %+v", vs)
	}
}

func TestMeaningFailsWhenAStoppedOperationSucceeded(t *testing.T) {
	intents, faults, end := clean()
	intents = withStop(intents, end, ans(202, "", `{"id":101,"status":"IN_PROGRESS"}`))
	only(t, Run(intents, faults, end), "meaning", "marked cancelled (202); the operation ended SUCCEEDED")
}

func TestMeaningFailsOnAStopAnsweredAlreadyRequested(t *testing.T) {
	intents, faults, end := clean()
	intents = withStop(intents, end, ans(409, "cancel-already-requested", `{}`))
	only(t, Run(intents, faults, end), "meaning", "yet answered already requested")
}

func TestLastResortLeavesACancelledOperationToAPerson(t *testing.T) {
	intents, faults, end := clean()
	end.Waiting = []Operation{{ID: 101, PolicyID: 11, Status: "NEEDS_RECONCILIATION", Stuck: "refund", StuckState: "UNKNOWN", StuckTruth: "NOT_STARTED"}}
	only(t, Run(intents, faults, end), "last-resort", "waits for a person at refund")
	// Cancelled by an admin after the provider's effect: a person's by design.
	end.Waiting[0].CancelRequestedAt = &t0
	if vs := LastResort(intents, faults, end); len(vs) != 0 {
		t.Errorf("a cancelled operation waiting for a person: %+v", vs)
	}
}
