package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// An admin cancels a live cancellation from its page while the provider
// drops every call (recovery keeps asking and trying the same key, so it
// stays live for as long as the test needs): the page says the cancel was
// asked for and then waits — it refreshes itself, no reload — until
// recovery has learned that the provider never got the call and stopped
// it; the page says so in a customer's words, and the provider, healthy
// again, received nothing more. Each stage at 1280 and 390 px (shoot:
// nothing wider than the screen).
func TestBrowserAdminCancelsALiveOperationAndThePageWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms",
		"RECOVERY_MAX_ATTEMPTS": "100", "RECOVERY_MAX_BACKOFF": "500ms"})
	b := browsertest.New(t)
	err := browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	// The operation starts once the browser is ready (on a loaded machine
	// Chromium's start takes a while).
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeDrop })
	r := s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "browser-stop", ""))
	var live operationJSON
	r.JSON(t, &live)
	if r.Status != 202 {
		t.Fatalf("cancel with the provider dropping: %d %s", r.Status, r.Body)
	}
	err = browsertest.Run(b,
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, live.ID)),
		chromedp.WaitVisible(`[data-testid="cancel-button"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, b, "cancel-offered")

	var asked string
	err = browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="cancel-state"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="cancel-state"]`, &asked, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(asked, "asked to stop") {
		t.Errorf("after the cancel the page says %q", asked)
	}
	shoot(t, b, "cancel-requested")
	s.setFaults(t, func(f *fake.Fault) {}) // a resend would now apply: none may come

	// The page waits on its own: the panel refreshes until the operation
	// is where the cancel led it.
	var outcome string
	err = browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="FAILED"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="cancel-state"]`, &outcome, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	var headline string
	browsertest.Run(b, chromedp.Text(`[data-testid="operation-panel"] hgroup`, &headline, chromedp.ByQuery))
	if !strings.Contains(outcome, "stopped before anything was done") || strings.Contains(headline, "refused") || s.effects(t, live.PolicyID) != 0 {
		t.Errorf("after the wait the page says %q (%q); %d provider effects, want 0", outcome, headline, s.effects(t, live.PolicyID))
	}
	shoot(t, b, "cancel-stopped")
	s.assertInvariants(t)
}

// A cancellation whose refund the payments service refused waits for a
// person; its page offers the admin the retry from the refund (a resume
// would ask the provider to cancel again), says what it does, and once
// clicked shows run 2 SUCCEEDED: one provider effect, one refund. At 1280
// and 390 px.
func TestBrowserAdminRetriesARefusedRefundFromItsPage(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "5s"})
	s.paymentsMode(t, fault.ModeReject)
	pid := s.policyOf(t, "demo-alice", 0)
	var stopped operationJSON
	s.do(cancelReq(pid, "demo-alice", "browser-retry", "")).JSON(t, &stopped)
	b := browsertest.New(t)
	var button, status string
	err := browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, stopped.ID)),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="NEEDS_RECONCILIATION"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="retry-from-button"]`, &button, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if button != "Retry from refund as run 2" {
		t.Fatalf("the retry button says %q", button)
	}
	shoot(t, b, "retry-offered")
	s.paymentsMode(t, fault.ModeOK)
	err = browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-testid="retry-from-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="operation-panel"]`, "data-status", &status, nil, chromedp.ByQuery),
	)
	if err != nil || status != "SUCCEEDED" || s.effects(t, pid) != 1 || s.refunds(t, pid) != 1 {
		t.Fatalf("after the retry: %q, %v; %d provider effects, %d refunds", status, err, s.effects(t, pid), s.refunds(t, pid))
	}
	shoot(t, b, "retried")
	s.assertInvariants(t)
}

// The operation page agrees with itself when it finishes on its own (issue
// 29's second read, finding 9): an admin watches a live cancellation, with
// Cancel offered beside its self-refreshing panel; recovery finishes it; the
// page no longer offers to cancel a SUCCEEDED operation — the refresh that
// brings the new state loads the whole page again, since the form outside
// the panel was chosen for the old one. The request key's state says until
// when its lease runs, so it stays true after the refreshing stops. At 1280
// and 390 px.
func TestBrowserOperationPageAgreesWithItselfWhenItFinishes(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "200ms",
		"RECOVERY_MAX_ATTEMPTS": "100", "RECOVERY_MAX_BACKOFF": "500ms"})
	b := browsertest.New(t)
	err := browsertest.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeDrop })
	r := s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "browser-agrees", ""))
	var live operationJSON
	r.JSON(t, &live)
	if r.Status != 202 {
		t.Fatalf("cancel with the provider dropping: %d %s", r.Status, r.Body)
	}
	err = browsertest.Run(b,
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, live.ID)),
		chromedp.WaitVisible(`[data-testid="cancel-button"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, b, "live")
	s.setFaults(t, func(f *fake.Fault) {}) // healed: recovery's next try goes through

	// Polled from here, not in the page: the page is loaded again on the
	// way (a poll inside it would end with the page it ran in).
	var agrees bool
	for deadline := time.Now().Add(time.Minute); !agrees && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		err = chromedp.Run(b, chromedp.Evaluate(`(() => {
			const p = document.querySelector('[data-testid="operation-panel"]');
			return !!p && p.dataset.status === 'SUCCEEDED' && !document.querySelector('[data-testid="cancel"]');
		})()`, &agrees))
	}
	if !agrees {
		var status string
		var forms int
		browsertest.Run(b,
			chromedp.AttributeValue(`[data-testid="operation-panel"]`, "data-status", &status, nil, chromedp.ByQuery),
			chromedp.Evaluate(`document.querySelectorAll('[data-testid="cancel"]').length`, &forms))
		t.Fatalf("the page shows %s with %d Cancel forms (%v)", status, forms, err)
	}
	var key string
	if err := browsertest.Run(b, chromedp.Text(`[data-testid="identity-Request"]`, &key, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(key, "completed") {
		t.Errorf("the request key reads %q", key)
	}
	shoot(t, b, "finished")
}
