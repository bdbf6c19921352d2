package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// The operations list as the admin meets it: counts per status at the top,
// each a filter; a row opens its operation's page. At 1280 and 390 px.
func TestBrowserOperationsList(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "2s", "RECOVERY_INTERVAL": "1h"})
	// Alice's first cancellation succeeds; bob's second waits on the provider.
	if r := s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "list-1", "")); r.Status != 200 {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeDrop })
	live := s.do(cancelReq(s.policyOf(t, "demo-bob", 0), "demo-bob", "list-2", ""))
	var op operationJSON
	live.JSON(t, &op)
	if live.Status != 202 {
		t.Fatalf("cancel with the provider dropping: %d %s", live.Status, live.Body)
	}

	b := browsertest.New(t)
	var rows int
	var waiting, inProgress string
	err := chromedp.Run(b,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/operations"),
		chromedp.WaitVisible(`[data-testid="operations"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="operations"] tbody tr').length`, &rows),
		chromedp.Text(fmt.Sprintf(`tr[data-operation-id="%d"]`, op.ID), &waiting, chromedp.ByQuery),
		chromedp.Text(`[data-status="IN_PROGRESS"] strong`, &inProgress, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if rows != 2 || !strings.Contains(waiting, "provider (provider_cancel)") || inProgress != "1" {
		t.Fatalf("list: %d rows, bob's row %q, IN_PROGRESS count %q", rows, waiting, inProgress)
	}
	shoot(t, b, "operations-all")

	// The IN_PROGRESS count is a filter; its one row opens the operation.
	var path string
	err = chromedp.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-status="IN_PROGRESS"] a`, chromedp.ByQuery),
		chromedp.WaitVisible(`a[aria-current="true"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="operations"] tbody tr').length`, &rows),
	)
	if err != nil || rows != 1 {
		t.Fatalf("filtered to IN_PROGRESS: %d rows, %v", rows, err)
	}
	shoot(t, b, "operations-in-progress")
	err = chromedp.Run(b,
		chromedp.Click(fmt.Sprintf(`tr[data-operation-id="%d"] a`, op.ID), chromedp.ByQuery),
		chromedp.WaitVisible(`main`, chromedp.ByQuery),
		chromedp.Evaluate(`location.pathname`, &path),
	)
	if err != nil || path != fmt.Sprintf("/operations/%d", op.ID) {
		t.Fatalf("the row led to %q, %v", path, err)
	}
}

// An admin resumes a FAILED cancellation from its page: the button says
// which run it starts, and the page then shows the new run SUCCEEDED.
func TestBrowserAdminResumesAFailedCancellation(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeReject })
	r := s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "browser-resume", ""))
	var refused struct {
		OperationID int64 `json:"operation_id"`
	}
	r.JSON(t, &refused)
	if r.Status != 422 {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	s.setFaults(t, func(f *fake.Fault) {})
	b := browsertest.New(t)
	var button, status string
	err := chromedp.Run(b,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, refused.OperationID)),
		chromedp.Text(`[data-testid="resume-button"]`, &button, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(button, "run 2") {
		t.Fatalf("the resume button says %q", button)
	}
	shoot(t, b, "resume-offered")
	err = chromedp.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-testid="resume-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="operation-panel"]`, "data-status", &status, nil, chromedp.ByQuery),
	)
	if err != nil || status != "SUCCEEDED" {
		t.Fatalf("after resume: %q, %v", status, err)
	}
	shoot(t, b, "resumed")
}
