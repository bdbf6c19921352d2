package main

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// Every count of attempts a reader meets agrees (issue 29, finding 18: "after
// 5 recovery stops and a person decides" beside an operation at attempts 9
// that finished on its own). A cancellation the provider never answers, with
// recovery's budget at 3: the request's attempt and two of recovery's back
// off, the third hands it to a person. On the desk's card and API, the
// operation's page and API and their timelines, every "N so far" and
// "Attempts N of M" is the operation's own count, every past "attempt k of
// M" is at most that, and every limit is the budget — while it waits, and
// after recovery's re-ask finishes it on its own.
func TestEveryCountOfAttemptsAgrees(t *testing.T) {
	t.Parallel()
	const budget = 3
	s := startServer(t, map[string]string{
		"PROVIDER_TIMEOUT": "300ms", "PROVIDER_IDEMPOTENT": "false", "OPERATION_LEASE": "2s",
		"RECOVERY_INTERVAL": "50ms", "RECOVERY_MAX_POLLS": "0", "RECOVERY_BACKOFF": "100ms",
		"RECOVERY_MAX_ATTEMPTS": strconv.Itoa(budget), "RECOVERY_CLOCK_SKEW": "0s", "RECOVERY_REASK_INTERVAL": "1h",
		"INSTANCE_ID": "app-1",
	})
	s.setFaults(t, func(f *fake.Fault) { f.Mode, f.Idempotent, f.StatusMode = fault.ModeDrop, false, fault.StatusError })
	var op operationJSON
	s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "attempts", "")).JSON(t, &op)
	ctx := context.Background()
	read := func() (status string, attempts int) {
		s.DB.Pool.QueryRow(ctx, `SELECT status, attempts FROM operations WHERE id = $1`, op.ID).Scan(&status, &attempts)
		return status, attempts
	}
	waitUntil(t, 60*time.Second, func() bool { st, _ := read(); return st == "NEEDS_RECONCILIATION" })

	admin := s.browserClient()
	s.signIn(t, admin, "admin")
	pages := func() map[string]string {
		out := map[string]string{}
		for _, p := range []string{"/reconciliation", fmt.Sprintf("/operations/%d", op.ID), fmt.Sprintf("/reconciliation/items/%d", op.ID)} {
			r := doWith(t, admin, s.URL, request{Method: "GET", Path: p})
			if r.Status != http.StatusOK {
				t.Fatalf("GET %s: %d", p, r.Status)
			}
			out[p] = html.UnescapeString(string(r.Body))
		}
		for _, p := range []string{"/api/v1/reconciliation", fmt.Sprintf("/api/v1/operations/%d", op.ID)} {
			out[p] = string(s.do(request{Method: "GET", Path: p, Token: "demo-admin"}).Body)
		}
		return out
	}
	_, attempts := read()
	if attempts != budget {
		t.Fatalf("handed to a person at attempts %d, want the budget %d", attempts, budget)
	}
	checkAttempts(t, "waiting", pages(), attempts, budget, true)

	// Healed, recovery's re-ask finishes it on its own: no attempt is used,
	// and no page counts more than were made, or a limit other than the budget.
	s.setFaults(t, func(f *fake.Fault) { f.Mode, f.Idempotent, f.StatusMode = fault.ModeOK, false, fault.StatusOK })
	if _, err := s.DB.Pool.Exec(ctx, `UPDATE operations SET next_attempt_at = now() WHERE id = $1`, op.ID); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, func() bool { st, _ := read(); return st == "SUCCEEDED" || st == "FAILED" })
	_, after := read()
	if after != attempts {
		t.Errorf("the re-ask changed the count of attempts: %d, then %d", attempts, after)
	}
	checkAttempts(t, "finished on its own", pages(), after, budget, false)
}

var (
	// The operation's count now: the desk card's, the operation page's, the APIs'.
	countNow = []*regexp.Regexp{
		regexp.MustCompile(`(\d+) attempts? so far`),
		regexp.MustCompile(`Attempts (\d+) of (\d+)`),
		regexp.MustCompile(`data-testid="fact-run">\s*\d+ · (\d+)`),
		// The APIs' operation (top-level in /operations/{id}, per item on
		// the desk); a step's "attempts" is its calls sent, another count.
		regexp.MustCompile(`^\{"id":\d+,[^{]*?"attempts":(\d+)`),
		regexp.MustCompile(`"operation_id":\d+,[^{]*?"attempts":(\d+)`),
	}
	// A count at some moment in the past (the timeline, the last error): at
	// most the count now, and of the budget.
	countThen = []*regexp.Regexp{
		regexp.MustCompile(`attempt (\d+) of (\d+)`),
		regexp.MustCompile(`after (\d+) attempts \(of (\d+)\)`),
	}
	limits = regexp.MustCompile(`limit of (\d+) attempts?|At (\d+) recovery hands it`)
	// A step's sends named as attempts: another count under the same name
	// (the evidence page's "sent (attempt 1)" beside "3 attempts so far").
	// ("delivery attempt N" is a callback's, named so.)
	misnamed = regexp.MustCompile(`(delivery )?[Aa]ttempt \d+( of)?`)
)

func checkAttempts(t *testing.T, when string, pages map[string]string, attempts, budget int, waiting bool) {
	t.Helper()
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	seen := 0
	matched := map[string]int{}
	for path, body := range pages {
		for _, re := range countNow {
			for _, m := range re.FindAllStringSubmatch(body, -1) {
				seen++
				matched[re.String()]++
				if n(m[1]) != attempts {
					t.Errorf("%s: %s says %q, but the operation's attempts are %d", when, path, m[0], attempts)
				}
				if len(m) > 2 && n(m[2]) != budget {
					t.Errorf("%s: %s says %q, but the budget is %d", when, path, m[0], budget)
				}
			}
		}
		for _, re := range countThen {
			for _, m := range re.FindAllStringSubmatch(body, -1) {
				seen++
				matched[re.String()]++
				if n(m[1]) > attempts || n(m[2]) != budget {
					t.Errorf("%s: %s says %q, with the operation at %d of %d", when, path, m[0], attempts, budget)
				}
			}
		}
		for _, m := range misnamed.FindAllStringSubmatch(body, -1) {
			if m[1] == "" && m[2] == "" {
				t.Errorf("%s: %s says %q: a count of calls named as the operation's attempts", when, path, m[0])
			}
		}
		for _, m := range limits.FindAllStringSubmatch(body, -1) {
			if l := n(m[1] + m[2]); l != budget {
				t.Errorf("%s: %s says %q, but the budget is %d", when, path, m[0], budget)
			}
		}
	}
	if seen < 4 {
		t.Errorf("%s: only %d counts of attempts found on the pages; the patterns have drifted from the wording", when, seen)
	}
	if waiting { // every place that counts is on show: each pattern must still find its count
		for _, re := range append(append([]*regexp.Regexp{}, countNow...), countThen...) {
			if matched[re.String()] == 0 {
				t.Errorf("%s: no count matches %s: the wording or the API has drifted from this test", when, re)
			}
		}
	}
}
