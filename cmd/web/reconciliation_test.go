package main

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// The reconciliation desk's tests share one way to fill the desk: a real
// outage. Cancellations are sent while the provider applies calls without
// answering (lost_response) or never receives them (drop), is not
// idempotent, and its status queries fail; recovery, out of attempts after
// one failed status query, hands each to a person.

// outageEnv makes the hand-over quick: a short provider timeout, one
// attempt, no polling, no clock-skew margin, and no re-asking during the
// test (the person asks).
var outageEnv = map[string]string{
	"PROVIDER_TIMEOUT":              "1s",
	"PROVIDER_IDEMPOTENT":           "false",
	"OPERATION_LEASE":               "2s",
	"RECOVERY_INTERVAL":             "50ms",
	"RECOVERY_BATCH":                "50",
	"RECOVERY_MAX_POLLS":            "0",
	"RECOVERY_MAX_ATTEMPTS":         "1",
	"RECOVERY_CLOCK_SKEW":           "0s",
	"RECOVERY_REASK_INTERVAL":       "1h",
	"RATE_LIMIT_WRITES_PER_USER":    "off",
	"RATE_LIMIT_WRITES_PER_ADDRESS": "off",
	"INSTANCE_ID":                   "app-1",
}

// outage leaves applied+dropped cancellations of new policies of alice's
// waiting for a person: the first applied by the provider, the rest never
// received. It returns the policies, applied first.
func outage(t *testing.T, s *testServer, applied, dropped int) []int64 {
	t.Helper()
	ctx := context.Background()
	rows, err := s.DB.Pool.Query(ctx, `
		INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
		SELECT u.id, 'POL-OUTAGE-' || lpad(g::text, 4, '0'), 'Alice Outage', 120, current_date - 10, current_date + 355
		  FROM users u, generate_series(1, $1) g
		 WHERE u.name = 'alice'
		 ORDER BY g
		RETURNING id`, applied+dropped)
	if err != nil {
		t.Fatal(err)
	}
	var policies []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		policies = append(policies, id)
	}
	if rows.Err() != nil || len(policies) != applied+dropped {
		t.Fatalf("seeded %d policies: %v", len(policies), rows.Err())
	}
	cancelAll := func(mode fault.Mode, ids []int64) {
		s.setFaults(t, func(f *fake.Fault) { f.Mode, f.Idempotent, f.StatusMode = mode, false, fault.StatusError })
		var wg sync.WaitGroup
		work := make(chan int64)
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range work {
					r := s.do(cancelReq(id, "demo-alice", fmt.Sprintf("outage-%d", id), `{"reason":"outage"}`))
					// 409 request-in-progress: Go's transport resent a keyed
					// POST on a connection a loaded machine broke, and the
					// first is still on its way; the key keeps it to one.
					if r.Status != http.StatusAccepted && r.problemType() != "request-in-progress" {
						t.Errorf("cancel %d in %s: %d %s", id, mode, r.Status, r.Body)
					}
				}
			}()
		}
		for _, id := range ids {
			work <- id
		}
		close(work)
		wg.Wait()
	}
	cancelAll(fault.ModeLostResponse, policies[:applied])
	cancelAll(fault.ModeDrop, policies[applied:])
	waitUntil(t, 60*time.Second, func() bool {
		var n int
		s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status = 'NEEDS_RECONCILIATION'`).Scan(&n)
		return n == len(policies)
	})
	return policies
}

// heal: the provider answers status queries again (and applies calls).
func heal(t *testing.T, s *testServer) {
	t.Helper()
	s.setFaults(t, func(f *fake.Fault) { f.Mode, f.Idempotent, f.StatusMode = fault.ModeOK, false, fault.StatusOK })
}

type deskJSON struct {
	Total    int            `json:"total"`
	ByReason map[string]int `json:"by_reason"`
	ByTruth  map[string]int `json:"by_truth"`
	Items    []struct {
		OperationID   int64     `json:"operation_id"`
		PolicyID      int64     `json:"policy_id"`
		Reason        string    `json:"reason"`
		TruthThen     string    `json:"truth_then"`
		TruthNow      string    `json:"truth_now"`
		SeenUpdatedAt time.Time `json:"seen_updated_at"`
		Advice        struct {
			Suggested   string       `json:"suggested"`
			Suggestion  string       `json:"suggestion"`
			Unambiguous bool         `json:"unambiguous"`
			Actions     []actionJSON `json:"actions"`
		} `json:"advice"`
	} `json:"items"`
}

func (s *testServer) desk(t *testing.T, query string) deskJSON {
	t.Helper()
	var d deskJSON
	r := s.do(request{Method: "GET", Path: "/api/v1/reconciliation" + query, Token: "demo-admin"})
	if r.Status != http.StatusOK {
		t.Fatalf("desk: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &d)
	return d
}

func (s *testServer) askAgain(t *testing.T) (asked, answered int) {
	t.Helper()
	var a struct{ Asked, Answered int }
	r := s.do(request{Method: "POST", Path: "/api/v1/reconciliation/ask", Token: "demo-admin", Body: `{}`})
	if r.Status != http.StatusOK {
		t.Fatalf("ask again: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &a)
	return a.Asked, a.Answered
}

// askUntilAllAnswer asks again until every one of n items got an answer
// (on a loaded machine a status query can outlive its timeout), as a
// person would.
func (s *testServer) askUntilAllAnswer(t *testing.T, n int) {
	t.Helper()
	for try := 1; ; try++ {
		asked, answered := s.askAgain(t)
		if asked != n {
			t.Fatalf("asked %d, want %d", asked, n)
		}
		if answered == n {
			return
		}
		if try == 5 {
			t.Fatalf("after %d tries, %d of %d answered", try, answered, n)
		}
	}
}

type batchJSON struct {
	Decided  int `json:"decided"`
	Changed  int `json:"state_changed"`
	Refused  int `json:"not_allowed"`
	NotFound int `json:"not_found"`
	Results  []struct {
		OperationID int64  `json:"operation_id"`
		Outcome     string `json:"outcome"`
		Detail      string `json:"detail"`
	} `json:"results"`
}

// decideSuggested posts, in one request, the suggested decision for every
// item of d whose truth now makes it unambiguous.
func (s *testServer) decideSuggested(t *testing.T, d deskJSON, key, note string) (batchJSON, response) {
	t.Helper()
	var decisions []map[string]any
	for _, it := range d.Items {
		if it.Advice.Unambiguous {
			decisions = append(decisions, map[string]any{"operation_id": it.OperationID, "action": it.Advice.Suggested,
				"seen_updated_at": it.SeenUpdatedAt, "truth_seen": it.TruthNow})
		}
	}
	body, _ := json.Marshal(map[string]any{"decisions": decisions, "note": note})
	r := s.do(request{Method: "POST", Path: "/api/v1/reconciliation/decisions", Token: "demo-admin", Body: string(body),
		Header: map[string]string{"Idempotency-Key": key}})
	var b batchJSON
	if r.Status == http.StatusOK {
		r.JSON(t, &b)
	}
	return b, r
}

// waitAllSucceeded waits until every operation is SUCCEEDED.
func waitAllSucceeded(t *testing.T, s *testServer, n int) {
	t.Helper()
	waitUntil(t, 60*time.Second, func() bool {
		var done int
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM operations WHERE status = 'SUCCEEDED'`).Scan(&done)
		return done == n
	})
}

// A desk left by an outage — half applied by the provider, half never
// received, its status queries failing — is cleared through the API in
// three requests: ask again (the outage goes on: nothing learned, nothing
// decided), ask again once healed (every truth conclusive), one bulk
// decision, which a replay does not repeat. Every decision agrees with the
// truth asked, each policy is cancelled exactly once at the provider, every
// invariant holds, and the audit trail has one line per item. These are
// the requests the desk's buttons send (the browser test clicks them).
func TestReconciliationBulkAPIClearsAnOutage(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	const applied, dropped = 100, 100
	began := time.Now()
	policies := outage(t, s, applied, dropped)
	outageTook := time.Since(began)

	d := s.desk(t, "")
	if d.Total != 200 || d.ByReason["out_of_attempts"] != 200 || d.ByTruth["UNKNOWN"] != 200 {
		t.Fatalf("desk after the outage: total %d, by reason %v, by truth %v", d.Total, d.ByReason, d.ByTruth)
	}
	for _, it := range d.Items {
		if it.Advice.Suggested != "ask_again" || it.Advice.Unambiguous || it.TruthThen != "UNKNOWN" {
			t.Fatalf("item %d before asking: then %s, suggests %q (unambiguous %t)", it.OperationID, it.TruthThen, it.Advice.Suggested, it.Advice.Unambiguous)
		}
	}
	// Asked during the outage: nothing answers, nothing is decided.
	if asked, answered := s.askAgain(t); asked != 200 || answered != 0 {
		t.Fatalf("ask during the outage: %d asked, %d answered", asked, answered)
	}
	if b, r := s.decideSuggested(t, s.desk(t, ""), "bulk-during-outage", ""); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a bulk decision with nothing unambiguous: %d %+v %s", r.Status, b, r.Body)
	}

	heal(t, s)
	start := time.Now()
	s.askUntilAllAnswer(t, 200)
	askTook := time.Since(start)
	d = s.desk(t, "")
	// What the provider's own ledger says happened (a lost_response call
	// that arrived after its deadline was refused, applying nothing).
	applies := map[int64]bool{}
	for id, n := range s.ledger(t) {
		applies[id] = n == 1
	}
	if n := countTrue(applies); d.ByTruth["COMPLETED"] != n || d.ByTruth["NOT_STARTED"] != 200-n {
		t.Fatalf("truth now once healed: %v; the ledger has %d applied", d.ByTruth, n)
	}
	for _, it := range d.Items {
		want := "retry"
		if applies[it.PolicyID] {
			want = "mark_done"
		}
		if it.Advice.Suggested != want || !it.Advice.Unambiguous {
			t.Fatalf("policy %d (applied %t): suggests %q, unambiguous %t", it.PolicyID, applies[it.PolicyID], it.Advice.Suggested, it.Advice.Unambiguous)
		}
	}

	start = time.Now()
	b, r := s.decideSuggested(t, d, "bulk-clear", "cleared after the outage")
	decideTook := time.Since(start)
	if r.Status != http.StatusOK || b.Decided != 200 || b.Changed+b.Refused+b.NotFound != 0 {
		t.Fatalf("bulk decision: %d %+v", r.Status, b)
	}
	// The same click again: the stored answer, nothing decided twice.
	_, again := s.decideSuggested(t, d, "bulk-clear", "cleared after the outage")
	if again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(r.Body) {
		t.Fatalf("replay: %d %q", again.Status, again.Header.Get("Idempotent-Replayed"))
	}
	began = time.Now()
	waitAllSucceeded(t, s, 200)
	finishTook := time.Since(began)
	ledger := s.ledger(t)
	for _, id := range policies {
		if n := ledger[id]; n != 1 {
			t.Errorf("policy %d: %d provider effects, want 1", id, n)
		}
	}
	s.assertInvariants(t)
	var decisions, notes int
	s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*), count(*) FILTER (WHERE note = 'cleared after the outage' AND batch_size = 200 AND decided_by = 'admin'
		                                      AND truth_seen = coalesce(truth_at_decision, 'UNKNOWN'))
		  FROM reconciliation_decisions`).Scan(&decisions, &notes)
	if decisions != 200 || notes != 200 {
		t.Errorf("audit trail: %d decisions, %d with the note, the batch and a truth seen that agrees", decisions, notes)
	}
	if d := s.desk(t, ""); d.Total != 0 {
		t.Errorf("desk after clearing: %d waiting", d.Total)
	}
	t.Logf("200 items: outage %s, ask again (healed) %s, one bulk decision of 200 %s, recovery finishing them %s",
		outageTook.Round(time.Millisecond), askTook.Round(time.Millisecond), decideTook.Round(time.Millisecond), finishTook.Round(time.Millisecond))
}

// The rules through the API: the evidence rules decisions out (mark done
// on NOT_STARTED, retry on COMPLETED is allowed but not suggested, bulk
// only where unambiguous); a note is optional and limited; two admins at
// once, one wins per item.
func TestReconciliationAPIRules(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	outage(t, s, 2, 2)
	heal(t, s)
	s.askUntilAllAnswer(t, 4)
	d := s.desk(t, "")
	var completed, notStarted []int
	for i, it := range d.Items {
		switch it.TruthNow {
		case "COMPLETED":
			completed = append(completed, i)
		case "NOT_STARTED":
			notStarted = append(notStarted, i)
		}
	}
	if len(completed) != 2 || len(notStarted) != 2 {
		t.Fatalf("truths: %v", d.ByTruth)
	}
	resolve := func(i int, action, note, key string) response {
		it := d.Items[i]
		body, _ := json.Marshal(map[string]any{"action": action, "seen_updated_at": it.SeenUpdatedAt, "truth_seen": it.TruthNow, "note": note})
		return s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/resolve", it.OperationID), Token: "demo-admin",
			Body: string(body), Header: map[string]string{"Idempotency-Key": key}})
	}
	// NOT_STARTED: mark done is ruled out (and says why), and disabled on the card.
	ns := d.Items[notStarted[0]]
	if done := findAction(ns.Advice.Actions, "mark_done"); done.Enabled || !strings.Contains(done.Disabled, "no record") {
		t.Errorf("NOT_STARTED card: mark done %+v", done)
	}
	if r := resolve(notStarted[0], "mark_cancelled", "", "k-ns-done"); r.Status != http.StatusConflict || !strings.Contains(string(r.Body), "no record of the call") {
		t.Errorf("mark done on NOT_STARTED: %d %s", r.Status, r.Body)
	}
	// A note over the limit is refused, naming the field; nothing is decided.
	if r := resolve(notStarted[0], "retry", strings.Repeat("n", 501), "k-long"); r.Status != http.StatusUnprocessableEntity ||
		!strings.Contains(string(r.Body), `"field":"note"`) {
		t.Errorf("a 501-byte note: %d %s", r.Status, r.Body)
	}
	// Without a note: decided.
	if r := resolve(notStarted[0], "retry", "", "k-ns-retry"); r.Status != http.StatusOK {
		t.Errorf("retry on NOT_STARTED without a note: %d %s", r.Status, r.Body)
	}
	// COMPLETED: mark failed is ruled out; mark done with a note is decided.
	if r := resolve(completed[0], "mark_failed", "", "k-c-fail"); r.Status != http.StatusConflict || r.problemType() != "resolution-not-allowed" {
		t.Errorf("mark failed on COMPLETED: %d %s", r.Status, r.Body)
	}
	if r := resolve(completed[0], "mark_done", "checked by phone", "k-c-done"); r.Status != http.StatusOK {
		t.Errorf("mark done on COMPLETED: %d %s", r.Status, r.Body)
	}
	// The same decision again on the state it saw: someone already decided.
	if r := resolve(completed[0], "mark_done", "", "k-c-done-2"); r.Status != http.StatusConflict {
		t.Errorf("a second decision on the same state: %d %s", r.Status, r.Body)
	}
	// Two admins decide the remaining two at once, in bulk: one wins per item.
	rest := deskJSON{Items: append(d.Items[completed[1]:completed[1]+1], d.Items[notStarted[1]])}
	results := make([]batchJSON, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b, r := s.decideSuggested(t, rest, fmt.Sprintf("admin-%d", i), fmt.Sprintf("admin %d", i))
			if r.Status != http.StatusOK {
				t.Errorf("admin %d: %d %s", i, r.Status, r.Body)
			}
			results[i] = b
		}()
	}
	close(start)
	wg.Wait()
	if results[0].Decided+results[1].Decided != 2 || results[0].Changed+results[1].Changed != 2 {
		t.Errorf("two admins at once: %+v and %+v", results[0], results[1])
	}
	var perItem int
	s.DB.Pool.QueryRow(context.Background(), `SELECT max(n) FROM (SELECT count(*) n FROM reconciliation_decisions GROUP BY operation_id) x`).Scan(&perItem)
	if perItem != 1 {
		t.Errorf("an operation with %d decisions", perItem)
	}
	// The audit trail: who, what, seeing which truth, with which note.
	var trail struct {
		Decisions []struct {
			OperationID int64  `json:"operation_id"`
			DecidedBy   string `json:"decided_by"`
			Decision    string `json:"decision"`
			TruthSeen   string `json:"truth_seen"`
			Note        string `json:"note"`
		} `json:"decisions"`
	}
	s.do(request{Method: "GET", Path: "/api/v1/reconciliation/decisions", Token: "demo-admin"}).JSON(t, &trail)
	if len(trail.Decisions) != 4 {
		t.Fatalf("audit trail: %+v", trail.Decisions)
	}
	found := false
	for _, dd := range trail.Decisions {
		if dd.OperationID == d.Items[completed[0]].OperationID {
			found = dd.DecidedBy == "admin" && dd.Decision == "mark_done" && dd.TruthSeen == "COMPLETED" && dd.Note == "checked by phone"
		}
	}
	if !found {
		t.Errorf("the phone-checked decision is not in the trail as made: %+v", trail.Decisions)
	}
	// And on the operation's timeline.
	var op struct {
		Timeline []struct{ Detail string } `json:"timeline"`
	}
	s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", d.Items[completed[0]].OperationID), Token: "demo-admin"}).JSON(t, &op)
	onTimeline := false
	for _, e := range op.Timeline {
		onTimeline = onTimeline || (strings.Contains(e.Detail, "by admin, seeing provider COMPLETED") && strings.Contains(e.Detail, "checked by phone"))
	}
	if !onTimeline {
		t.Errorf("the decision is not on the timeline: %+v", op.Timeline)
	}
	waitAllSucceeded(t, s, 4)
	s.assertInvariants(t)
}

// ledger is the provider's effects (due and pending) per policy.
func (s *testServer) ledger(t *testing.T) map[int64]int64 {
	t.Helper()
	ctl := fake.NewControl(s.ProviderURL)
	defer ctl.CloseIdleConnections()
	eff, err := ctl.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[int64]int64{}
	for _, pe := range eff.ByPolicy {
		m[pe.PolicyID] = pe.Count + pe.Pending
	}
	return m
}

func countTrue(m map[int64]bool) int {
	n := 0
	for _, v := range m {
		if v {
			n++
		}
	}
	return n
}

type actionJSON struct {
	Action   string `json:"action"`
	Label    string `json:"label"`
	Enabled  bool   `json:"enabled"`
	Disabled string `json:"disabled_because"`
	Caution  string `json:"caution"`
}

func findAction(actions []actionJSON, name string) actionJSON {
	for _, a := range actions {
		if a.Action == name {
			return a
		}
	}
	return actionJSON{}
}

// The desk's own advice keeps the invariants green (the fresh reader's
// finding 1): payments refuses a refund after the provider cancelled; the
// card advises "do it by hand, then mark it done"; done so, invariant 7 no
// longer reports the refund DONE that payments has no COMPLETED record of —
// the person's decision is the record, on the audit trail.
func TestDoneByHandKeepsTheInvariantsGreen(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "5s"})
	s.paymentsMode(t, fault.ModeReject)
	var op operationJSON
	s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "by-hand", "")).JSON(t, &op)
	d := s.desk(t, "")
	if d.Total != 1 || d.Items[0].OperationID != op.ID {
		t.Fatalf("desk: %+v", d)
	}
	it := d.Items[0]
	if done := findAction(it.Advice.Actions, "mark_done"); !done.Enabled {
		t.Fatalf("a refused refund's card does not offer mark done: %+v", it.Advice.Actions)
	}
	// Every decision the card allows takes a note (the desk records each
	// "with your name and note"), not only a suggested one.
	client := s.browserClient()
	s.signIn(t, client, "admin")
	page := string(doWith(t, client, s.URL, request{Method: "GET", Path: "/reconciliation"}).Body)
	if !strings.Contains(page, `data-testid="note-mark_done"`) {
		t.Errorf("the refused refund's card offers mark done without a note")
	}
	body, _ := json.Marshal(map[string]any{"action": "mark_done", "seen_updated_at": it.SeenUpdatedAt, "truth_seen": it.TruthNow,
		"note": "refunded by bank transfer"})
	if r := s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/resolve", op.ID), Token: "demo-admin",
		Body: string(body), Header: map[string]string{"Idempotency-Key": "by-hand"}}); r.Status != http.StatusOK {
		t.Fatalf("done by hand: %d %s", r.Status, r.Body)
	}
	s.assertInvariants(t)
}

// The desk's own "Try this" — heal, then ask again — races recovery's
// re-ask (issue 29, finding 16). Recovery settles the item first; the
// person's "ask again" then asks nothing, and the desk says that recovery
// settled it before they asked (not "Asked again: 0 of 0 answered" above
// "Nothing needs a person"); the API's answer counts the same.
func TestAskingAgainAfterRecoverySettledItSaysSo(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	outage(t, s, 1, 0)
	heal(t, s)
	ctx := context.Background()
	var id int64
	if err := s.DB.Pool.QueryRow(ctx, `
		UPDATE operations
		   SET next_attempt_at = now() -- recovery's re-ask is due now: it asks before the person does
		 WHERE status = 'NEEDS_RECONCILIATION'
		RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	client := s.browserClient()
	s.signIn(t, client, "admin")
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/reconciliation"})
	csrf := csrfInput.FindSubmatch(page.Body)
	if csrf == nil {
		t.Fatalf("no CSRF field on the desk")
	}
	waitUntil(t, 30*time.Second, func() bool {
		var status string
		s.DB.Pool.QueryRow(ctx, `SELECT status FROM operations WHERE id = $1`, id).Scan(&status)
		return status == "SUCCEEDED"
	})
	r := postForm(t, s, client, "/reconciliation/ask", url.Values{"_csrf": {string(csrf[1])}, "id": {fmt.Sprint(id)}})
	if r.Status != http.StatusSeeOther {
		t.Fatalf("ask again: %d %s", r.Status, r.Body)
	}
	desk := string(doWith(t, client, s.URL, request{Method: "GET", Path: r.Header.Get("Location")}).Body)
	notice := html.UnescapeString(regexp.MustCompile(`(?s)data-testid="notice">(.*?)</p>`).FindStringSubmatch(desk)[1])
	for _, want := range []string{"Nothing was asked again", "1 of the 1 you asked about no longer waits for a person",
		"recovery settled 1 on its own", "before you asked", "None of them waits"} {
		if !strings.Contains(notice, want) {
			t.Errorf("the notice %q does not say %q", notice, want)
		}
	}
	if strings.Contains(notice, "0 of 0") {
		t.Errorf("the notice %q counts nothing and says nothing of recovery", notice)
	}
	var a struct {
		Asked      int `json:"asked"`
		ByRecovery int `json:"settled_by_recovery"`
		ByPerson   int `json:"decided_by_a_person"`
		Waiting    int `json:"still_waiting"`
	}
	s.do(request{Method: "POST", Path: "/api/v1/reconciliation/ask", Token: "demo-admin",
		Body: fmt.Sprintf(`{"operation_ids":[%d]}`, id)}).JSON(t, &a)
	if a.Asked != 0 || a.ByRecovery != 1 || a.ByPerson != 0 || a.Waiting != 0 {
		t.Errorf("the API's answer: %+v, want asked 0, settled by recovery 1", a)
	}
}

// The README's Payments recipe, from the pages (issue 29, finding 17): as
// admin, make payments not idempotent (the page's switch: the fake and the
// belief together), lost_response, status queries failing; cancel a policy
// as alice. The refund is paid, its answer lost, payments cannot be asked:
// recovery hands the cancellation to a person without sending the refund
// again. The desk's button is "Hand back to recovery" and says it sends
// nothing until payments answers; pressed, it sends nothing — one refund
// in the ledger, never "refunded twice".
func TestTheReadmesRefundRecipeRefundsOnce(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{
		"PAYMENTS_TIMEOUT":  "500ms",
		"RECOVERY_INTERVAL": "100ms", "RECOVERY_POLL_INTERVAL": "100ms", "RECOVERY_MAX_POLLS": "1",
		"RECOVERY_BACKOFF": "200ms", "RECOVERY_MAX_ATTEMPTS": "2", "RECOVERY_REASK_INTERVAL": "1h",
		"INSTANCE_ID": "app-1",
	})
	admin := s.browserClient()
	s.signIn(t, admin, "admin")
	page := doWith(t, admin, s.URL, request{Method: "GET", Path: "/payments"})
	csrf := string(csrfInput.FindSubmatch(page.Body)[1])
	for _, form := range []url.Values{{"idempotent": {"false"}}, {"mode": {"lost_response"}}, {"status_mode": {"error"}}} {
		form.Set("_csrf", csrf)
		if r := postForm(t, s, admin, "/payments/faults", form); r.Status != http.StatusSeeOther {
			t.Fatalf("payments form %v: %d %s", form, r.Status, r.Body)
		}
	}
	pid := s.policyOf(t, "demo-alice", 0)
	var op operationJSON
	s.do(cancelReq(pid, "demo-alice", "readme-refund", "")).JSON(t, &op)
	ctx := context.Background()
	status := func() string {
		var st string
		s.DB.Pool.QueryRow(ctx, `SELECT status FROM operations WHERE id = $1`, op.ID).Scan(&st)
		return st
	}
	waitUntil(t, 60*time.Second, func() bool { return status() == "NEEDS_RECONCILIATION" })
	if n := s.refunds(t, pid); n != 1 {
		t.Fatalf("refunds %d before a person decides, want 1 (lost_response pays it; recovery must not pay it again)", n)
	}
	d := s.desk(t, "")
	if d.Total != 1 {
		t.Fatalf("desk: %+v", d)
	}
	it := d.Items[0]
	back := findAction(it.Advice.Actions, "retry")
	if !back.Enabled || back.Label != "Hand back to recovery" || !strings.Contains(back.Caution, "not believed idempotent") ||
		!strings.Contains(back.Caution, "sends nothing until payments answers") {
		t.Fatalf("the card's hand-back: %+v", back)
	}
	body, _ := json.Marshal(map[string]any{"action": "retry", "seen_updated_at": it.SeenUpdatedAt, "truth_seen": it.TruthNow})
	if r := s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/admin/operations/%d/resolve", op.ID), Token: "demo-admin",
		Body: string(body), Header: map[string]string{"Idempotency-Key": "readme-hand-back"}}); r.Status != http.StatusOK {
		t.Fatalf("hand back: %d %s", r.Status, r.Body)
	}
	// Recovery asks, cannot, backs off and, out of attempts, hands it back
	// to a person — sending nothing.
	waitUntil(t, 60*time.Second, func() bool { return status() == "NEEDS_RECONCILIATION" })
	if n := s.refunds(t, pid); n != 1 {
		t.Fatalf("refunds %d after handing back, want 1: the button said it sends nothing", n)
	}
	var ledger struct {
		BySubject []struct {
			PolicyID *int64 `json:"policy_id"`
			Refunds  int64  `json:"refunds"`
		} `json:"by_subject"`
	}
	s.do(request{Method: "GET", Path: "/api/v1/payments/ledger", Token: "demo-admin"}).JSON(t, &ledger)
	for _, l := range ledger.BySubject {
		if l.PolicyID != nil && *l.PolicyID == pid && l.Refunds != 1 {
			t.Fatalf("the Payments page's ledger shows %d refunds for the policy", l.Refunds)
		}
	}
}
