package main

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/labs"
)

var (
	dropBlocks = regexp.MustCompile(`(?is)<(script|style|pre|code|textarea|svg)\b.*?</(script|style|pre|code|textarea|svg)>`)
	blockTag   = regexp.MustCompile(`(?i)</?(p|li|td|th|dd|dt|h[1-6]|div|section|article|header|footer|summary|details|tr|table|ul|ol|dl|form|button|label|option|select|hgroup|nav|main|br)\b[^>]*>`)
	anyTag     = regexp.MustCompile(`<[^>]*>`)
	spaces     = regexp.MustCompile(`\s+`)
)

// textBlocks is a page's text as a person reads it, one block (a paragraph,
// a cell, an item) a line; code and scripts left out.
func textBlocks(page string) []string {
	page = dropBlocks.ReplaceAllString(page, " ")
	page = spaces.ReplaceAllString(page, " ")
	page = blockTag.ReplaceAllString(page, "\n")
	page = html.UnescapeString(anyTag.ReplaceAllString(page, ""))
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// unbalanced reports whether s opens a parenthesis it does not close, or
// closes one it never opened.
func unbalanced(s string) bool {
	depth := 0
	for _, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			if depth--; depth < 0 {
				return true
			}
		}
	}
	return depth != 0
}

// No page leaves a parenthesis open (issue 29's second read, finding 21):
// every page a customer and an admin can open — with a lab run, an item on
// the desk, a deposit booking and the docs among them — each block of its
// text.
func TestNoPageLeavesAParenthesisOpen(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "off", "EVENTS_TRANSPORT": "river", "PAYMENTS_TIMEOUT": "5s",
		"PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "100ms", "RECOVERY_BACKOFF": "120s"})
	var op, waiting operationJSON
	if r := s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "parens", "")); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	} else {
		r.JSON(t, &op)
	}
	s.paymentsMode(t, fault.ModeReject) // the refund refused: the cancellation waits for a person
	s.do(cancelReq(s.policyOf(t, "demo-alice", 1), "demo-alice", "parens-waiting", "")).JSON(t, &waiting)
	s.paymentsMode(t, fault.ModeOK)
	// The provider applies a cancellation and never answers, and its status
	// cannot be asked: recovery's poll says why, with the error chain in
	// parentheses — the line the finding was about.
	unasked := s.policyOf(t, "demo-alice", 2)
	for _, f := range []string{`{"mode": "ok", "idempotent": true, "status_mode": "error"}`,
		fmt.Sprintf(`{"mode": "lost_response", "idempotent": true, "policy_id": %d}`, unasked)} {
		if r := s.do(request{Method: "PUT", Path: "/api/v1/provider/faults", Token: "demo-admin", Body: f}); r.Status >= 300 {
			t.Fatalf("faults: %d %s", r.Status, r.Body)
		}
	}
	var polled operationJSON
	s.do(cancelReq(unasked, "demo-alice", "parens-unasked", "")).JSON(t, &polled)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var n int
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM operation_events WHERE operation_id = $1 AND detail LIKE '%could not be asked (%'`,
			polled.ID).Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("recovery never said the provider could not be asked")
		}
	}
	var booking struct {
		ID int64 `json:"id"`
	}
	s.book("demo-alice", depositSlot(t, s.DB, 0), newKey(), "").JSON(t, &booking)
	pages := []string{"/", "/policies", fmt.Sprintf("/policies/%d", op.PolicyID), "/slots", "/provider", "/payments", "/recovery",
		"/operations", fmt.Sprintf("/operations/%d", op.ID), fmt.Sprintf("/operations/%d", waiting.ID), fmt.Sprintf("/operations/%d", polled.ID), "/events", "/labs",
		"/labs/race", "/docs/", "/ideas/retry-is-not-recovery", "/ideas/crash-between-effect-and-record", "/code/",
		fmt.Sprintf("/bookings/%d", booking.ID)}
	for _, l := range labs.All() {
		if l.Name == "timeouts" || l.Name == "redis" {
			pages = append(pages, "/labs/"+l.Name)
			continue
		}
		var run labRun
		if r := s.do(runLabReq(l.Name, "demo-alice", "parens-"+l.Name)); r.Status != http.StatusCreated {
			t.Fatalf("run %s: %d %s", l.Name, r.Status, r.Body)
		} else {
			r.JSON(t, &run)
		}
		pages = append(pages, fmt.Sprintf("/labs/%s/runs/%d", l.Name, run.ID))
	}
	docs := []string{"README", "SECURITY"}
	entries, _ := os.ReadDir("../../docs")
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".md"); ok {
			docs = append(docs, name)
		}
	}
	for _, d := range docs {
		pages = append(pages, "/docs/"+d)
	}
	admin := []string{"/reconciliation", fmt.Sprintf("/reconciliation/items/%d", waiting.ID), "/admin/demo", "/provider", "/payments",
		"/recovery", "/operations", fmt.Sprintf("/operations/%d", op.ID), fmt.Sprintf("/operations/%d", waiting.ID), "/events"}
	for as, list := range map[string][]string{"alice": pages, "admin": admin} {
		client := s.browserClient()
		s.signIn(t, client, as)
		for _, path := range list {
			r := doWith(t, client, s.URL, request{Method: "GET", Path: path})
			if r.Status != http.StatusOK {
				t.Errorf("%s GET %s: %d", as, path, r.Status)
				continue
			}
			for _, b := range textBlocks(string(r.Body)) {
				if unbalanced(b) {
					t.Errorf("%s %s: %q", as, path, b)
				}
			}
		}
	}
}
