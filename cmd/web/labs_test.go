package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/labs"
)

// labRun is the JSON of a lab's run as the API answers it.
type labRun struct {
	ID       int64  `json:"id"`
	Lab      string `json:"lab"`
	Variants []struct {
		Name   string         `json:"name"`
		Broken bool           `json:"broken"`
		Held   bool           `json:"held"`
		Counts map[string]int `json:"counts"`
	} `json:"variants"`
	Operations []int64 `json:"operations"`
	Live       []struct {
		Mode            string `json:"mode"`
		Status          string `json:"status"`
		PolicyID        int64  `json:"policy_id"`
		ProviderEffects int64  `json:"provider_effects"`
	} `json:"live"`
}

func runLabReq(lab, token, key string) request {
	return request{Method: "POST", Path: "/api/v1/labs/" + lab + "/runs", Token: token,
		Header: map[string]string{"Idempotency-Key": key}}
}

// A run is keyed: the same request sent twice at once runs the lab once,
// and both answers are the same bytes.
func TestLabRunsFromTheAPIOncePerKey(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "off"})

	var list struct {
		Labs []struct {
			Name string `json:"name"`
			Code []struct {
				Path string `json:"path"`
				Line int    `json:"line"`
			} `json:"code"`
		} `json:"labs"`
	}
	r := s.do(request{Method: "GET", Path: "/api/v1/labs", Token: "demo-alice"})
	r.JSON(t, &list)
	if r.Status != http.StatusOK || len(list.Labs) != len(labs.All()) || len(list.Labs[0].Code) == 0 {
		t.Fatalf("GET /api/v1/labs: %d %s", r.Status, r.Body)
	}
	answers := make([]response, 2)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = s.do(runLabReq("claim", "demo-alice", "lab-run-1")) }()
	}
	wg.Wait()
	var run labRun
	answers[0].JSON(t, &run)
	for _, a := range answers {
		if a.Status != http.StatusCreated || string(a.Body) != string(answers[0].Body) {
			t.Fatalf("the two answers: %d %s / %d %s", answers[0].Status, answers[0].Body, answers[1].Status, answers[1].Body)
		}
	}
	if answers[0].Header.Get("Location") != fmt.Sprintf("/api/v1/labs/claim/runs/%d", run.ID) {
		t.Errorf("Location %q", answers[0].Header.Get("Location"))
	}
	replayed := answers[0].Header.Get("Idempotent-Replayed") + answers[1].Header.Get("Idempotent-Replayed")
	if replayed != "true" {
		t.Errorf("exactly one answer should be a replay: %q", replayed)
	}
	var runs int
	if err := s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM labs.runs`).Scan(&runs); err != nil || runs != 1 {
		t.Fatalf("labs.runs has %d rows (%v): a double-click must run the lab once", runs, err)
	}
	if len(run.Variants) != 2 || run.Variants[0].Held || !run.Variants[1].Held ||
		run.Variants[0].Counts["executions"] != 3 || run.Variants[1].Counts["executions"] != 1 {
		t.Fatalf("the claim lab's result: %s", answers[0].Body)
	}

	// Reading it back: the caller's, and nobody else's.
	got := s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/labs/claim/runs/%d", run.ID), Token: "demo-alice"})
	if got.Status != http.StatusOK {
		t.Fatalf("GET the run: %d %s", got.Status, got.Body)
	}
	for _, tc := range []struct {
		path, token string
		status      int
	}{
		{fmt.Sprintf("/api/v1/labs/claim/runs/%d", run.ID), "demo-bob", http.StatusNotFound},
		{fmt.Sprintf("/api/v1/labs/claim/runs/%d", run.ID), "demo-admin", http.StatusOK},
		{fmt.Sprintf("/api/v1/labs/fencing/runs/%d", run.ID), "demo-alice", http.StatusNotFound},
		{"/api/v1/labs/nope/runs", "demo-alice", http.StatusNotFound},
		{"/api/v1/labs/claim/runs/abc", "demo-alice", http.StatusNotFound},
	} {
		if r := s.do(request{Method: "GET", Path: tc.path, Token: tc.token}); r.Status != tc.status {
			t.Errorf("GET %s as %s: %d, want %d", tc.path, tc.token, r.Status, tc.status)
		}
	}
	var mine struct {
		Runs []labRun `json:"runs"`
	}
	s.do(request{Method: "GET", Path: "/api/v1/labs/claim/runs", Token: "demo-alice"}).JSON(t, &mine)
	if len(mine.Runs) != 1 || mine.Runs[0].ID != run.ID {
		t.Errorf("alice's runs: %+v", mine.Runs)
	}
	if r := s.do(runLabReq("nope", "demo-alice", "lab-run-2")); r.Status != http.StatusNotFound || r.problemType() != "not-found" {
		t.Errorf("an unknown lab: %d %s", r.Status, r.Body)
	}
	if r := s.do(runLabReq("fencing", "demo-alice", "lab-run-1")); r.Status != http.StatusUnprocessableEntity {
		t.Errorf("one key for another lab: %d %s", r.Status, r.Body)
	}

	// The two labs of issue 28 through the API: each broken variant broke
	// its own way, the correct one held.
	for lab, want := range map[string]map[string]string{
		"webhooks": {"blind": "duplicates backwards", "no-fence": "duplicates", "no-monotonic": "backwards", "correct": ""},
		"ordering": {"naive": "out_of_place wrong", "versioned": ""},
	} {
		var run labRun
		r := s.do(runLabReq(lab, "demo-alice", "lab-"+lab))
		r.JSON(t, &run)
		if r.Status != http.StatusCreated || len(run.Variants) != len(want) {
			t.Fatalf("%s: %d %s", lab, r.Status, r.Body)
		}
		for _, v := range run.Variants {
			var broke []string
			for _, k := range []string{"duplicates", "backwards", "out_of_place", "wrong"} {
				if v.Counts[k] > 0 {
					broke = append(broke, k)
				}
			}
			if got := strings.Join(broke, " "); got != want[v.Name] || v.Held != (got == "") || v.Broken != (got != "") {
				t.Errorf("%s %s: broke %q (held %t), want %q", lab, v.Name, got, v.Held, want[v.Name])
			}
		}
	}
}

// The timeout lab for real: three cancellations, three faults, and the
// recovery loop finishes each with one provider effect per policy.
func TestTimeoutLabUntilRecoveryFinishesEach(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{
		"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "200ms", "RECOVERY_POLL_INTERVAL": "200ms",
		"OPERATION_LEASE": "2s", "EVENTS_TRANSPORT": "river",
	})
	r := s.do(runLabReq("timeouts", "demo-alice", "timeouts-1"))
	var run labRun
	r.JSON(t, &run)
	if r.Status != http.StatusCreated || len(run.Operations) != 3 {
		t.Fatalf("run the timeout lab: %d %s", r.Status, r.Body)
	}
	for _, v := range run.Variants {
		if v.Counts["timeouts"] != 1 {
			t.Errorf("%s: the first call should have timed out: %v", v.Name, v.Counts)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/labs/timeouts/runs/%d", run.ID), Token: "demo-alice"}).JSON(t, &run)
		done := len(run.Live) == 3
		for _, op := range run.Live {
			done = done && op.Status == "SUCCEEDED"
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recovery did not finish the three operations: %+v", run.Live)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, op := range run.Live {
		if op.ProviderEffects != 1 {
			t.Errorf("%s: the provider cancelled policy %d %d times", op.Mode, op.PolicyID, op.ProviderEffects)
		}
	}
	s.assertInvariants(t)
}

// The labs' index says of each lab what the lab's own page opens with
// (issue 29's second read, finding 12: lab 11's line on /labs was the first
// sentence of its lesson, "A refund follows once the provider's step is
// settled.", not what its page is about): one summary, shown in both places.
func TestLabsIndexSaysWhatEachLabPageSays(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	client := s.browserClient()
	s.signIn(t, client, "alice")
	index := string(doWith(t, client, s.URL, request{Method: "GET", Path: "/labs"}).Body)
	for _, l := range labs.All() {
		item := regexp.MustCompile(`(?s)<li data-lab="` + l.Name + `">.*?data-testid="lab-summary">([^<]+)</small>`).FindStringSubmatch(index)
		page := string(doWith(t, client, s.URL, request{Method: "GET", Path: "/labs/" + l.Name}).Body)
		own := regexp.MustCompile(`data-testid="lab-summary">([^<]+)</p>`).FindStringSubmatch(page)
		if item == nil || own == nil || item[1] != own[1] || strings.TrimSpace(own[1]) == "" {
			t.Errorf("lab %d (%s): the index says %q, its page %q", l.Number, l.Name, item, own)
		}
	}
}

// The Redis lab on a machine without Redis (issue 29, finding 15): the Labs
// list says lab 1 needs it, and a run — from the API or from the lab's page —
// says what is missing (503 lab-unavailable), never the generic "Something
// went wrong on our side".
func TestTheRedisLabWithoutRedisSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_SERVER": "/nonexistent/redis-server"})
	const missing = "Redis does not answer at REDIS_URL"

	r := s.do(runLabReq("redis", "demo-alice", "redis-away"))
	var p struct{ Detail string }
	r.JSON(t, &p)
	if r.Status != http.StatusServiceUnavailable || r.problemType() != "lab-unavailable" || !strings.Contains(p.Detail, missing) ||
		strings.Contains(p.Detail, "127.0.0.1:1") { // the variable, not the address: the log has the cause
		t.Errorf("POST /api/v1/labs/redis/runs without Redis: %d %s, want 503 lab-unavailable saying %q", r.Status, r.Body, missing)
	}

	client := s.browserClient()
	s.signIn(t, client, "alice")
	list := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs"})
	if !regexp.MustCompile(`data-lab="redis"(?s:.)*?data-testid="lab-needs">needs Redis`).Match(list.Body) {
		t.Errorf("the Labs list does not say the Redis lab needs Redis")
	}
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs/redis"})
	form := url.Values{}
	for _, m := range regexp.MustCompile(`name="(_csrf|idempotency_key)" value="([^"]*)"`).FindAllSubmatch(page.Body, -1) {
		form.Set(string(m[1]), string(m[2]))
	}
	if form.Get("_csrf") == "" || form.Get("idempotency_key") == "" {
		t.Fatalf("the Redis lab's page has no run form:\n%s", page.Body)
	}
	run := postForm(t, s, client, "/labs/redis/runs", form)
	body := string(run.Body)
	if run.Status != http.StatusServiceUnavailable || !strings.Contains(body, missing) || strings.Contains(body, "Something went wrong") {
		t.Errorf("the lab's Run without Redis: %d, want 503 saying %q:\n%s", run.Status, missing, body)
	}
}

// The double-click lab under an armed crash point (third read: arming
// after_provider_cancel to abandon the request, then pressing "Twice, same
// key", ended the whole process — net/http recovers the abandon's
// http.ErrAbortHandler only on the goroutine it serves from, and the lab
// sends its two clicks from goroutines of its own). The page answers, says
// the click got no answer, and the server stays up.
func TestTheDoubleClickLabSurvivesAnArmedCrashPoint(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin", Body: `{"at": "after_provider_cancel", "mode": "abandon"}`}); r.Status != http.StatusOK {
		t.Fatalf("arming a crash point: %d %s", r.Status, r.Body)
	}
	client := s.browserClient()
	s.signIn(t, client, "alice")
	pid := s.policyOf(t, "demo-alice", 0)
	page := doWith(t, client, s.URL, request{Method: "GET", Path: fmt.Sprintf("/policies/%d", pid)})
	m := csrfInput.FindSubmatch(page.Body)
	if m == nil {
		t.Fatalf("no CSRF field on the policy's page: %d", page.Status)
	}
	r := postForm(t, s, client, fmt.Sprintf("/policies/%d/double-click", pid), url.Values{"_csrf": {string(m[1])}, "mode": {"same-key"}})
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "no answer: the armed crash point cut it off") ||
		!strings.Contains(string(r.Body), "A crash point cut a click off") || strings.Contains(string(r.Body), "The request key did it") {
		t.Fatalf("the lab under an armed crash point: %d %s", r.Status, r.Body)
	}
	if h := s.do(request{Method: "GET", Path: "/healthz"}); h.Status != http.StatusOK {
		t.Fatalf("the server after the lab: %d", h.Status)
	}
}
