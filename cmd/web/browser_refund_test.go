package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/fault"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
)

// A customer cancels; the provider confirms at once, the refund's call to
// payments times out. The operation page shows it step by step: the policy
// cancelled, the refund UNKNOWN, each system's truth beside its key — and
// then, payments healthy again, recovery asks, sends the same refund under
// the same key, and the page reaches SUCCEEDED. Screenshots at 1280 and
// 390 px, during and after.
func TestBrowserARefundThatTimesOutIsFinishedByRecovery(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{
		"PAYMENTS_FAULT_MODE": "drop", // the refund never arrives: the call times out
		"PAYMENTS_TIMEOUT":    "500ms",
		"RECOVERY_INTERVAL":   "100ms", "RECOVERY_POLL_INTERVAL": "200ms", "RECOVERY_MAX_POLLS": "2",
		"RECOVERY_BACKOFF": "300ms", "RECOVERY_CLOCK_SKEW": "200ms", "INSTANCE_ID": "app-1",
	})
	pid := s.policyOf(t, "demo-alice", 0)
	ctx := browsertest.New(t)
	err := chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(fmt.Sprintf("%s/policies/%d", s.URL, pid)),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="step-provider_cancel"][data-state="DONE"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	// While payments drops every call, the refund stays in doubt: the page
	// shows it (the state changes as recovery retries: SENT, UNKNOWN).
	var refund, truth string
	err = chromedp.Run(ctx,
		chromedp.WaitVisible(`[data-testid="step-refund"]:not([data-state="PENDING"]):not([data-state="DONE"])`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="step-refund"]`, "data-state", &refund, nil, chromedp.ByQuery),
		chromedp.Text(`[data-testid="truth-refund"]`, &truth, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if refund != "SENT" && refund != "UNKNOWN" {
		t.Errorf("the refund step while payments drops calls: %q", refund)
	}
	shoot(t, ctx, "refund-in-doubt")

	// Payments heals: recovery's next attempt asks, hears NOT_STARTED (the
	// dropped calls never arrived; their deadlines passed), sends the same
	// refund again, and finishes the workflow.
	ctl := paymentsfake.NewControl(s.PaymentsURL, "")
	defer ctl.CloseIdleConnections()
	if _, err := ctl.SetFaults(context.Background(), fault.Default()); err != nil {
		t.Fatal(err)
	}
	var status, key, timeline string
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = chromedp.Run(waitCtx,
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="step-refund"]`, "data-state", &refund, nil, chromedp.ByQuery),
		chromedp.Text(`[data-testid="truth-refund"]`, &truth, chromedp.ByQuery),
		chromedp.Text(`[data-testid="step-key-refund"]`, &key, chromedp.ByQuery),
		chromedp.Text(`[data-testid="operation-status"]`, &status, chromedp.ByQuery),
		chromedp.Text(`[data-testid="timeline"]`, &timeline, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if refund != "DONE" || !strings.Contains(truth, "COMPLETED") || !strings.HasSuffix(key, ":refund") {
		t.Errorf("after recovery: refund %s, truth %q, key %q", refund, truth, key)
	}
	if !strings.Contains(timeline, "recovery on app-1") {
		t.Errorf("the timeline does not show recovery's work: %q", timeline)
	}
	shoot(t, ctx, "refund-finished")
	var refunds int
	s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fake_payments.ledger WHERE kind = 'refund' AND policy_id = $1`, pid).Scan(&refunds)
	if refunds != 1 {
		t.Fatalf("refunds %d", refunds)
	}
	s.assertInvariants(t)
}

// shoot takes the page at 1280 and 390 px wide, and fails the test when the
// page is wider than the screen (something that does not wrap).
func shoot(t *testing.T, ctx context.Context, label string) {
	t.Helper()
	for _, width := range []int64{1280, 390} {
		var scroll int64
		if err := chromedp.Run(ctx, chromedp.EmulateViewport(width, 900),
			chromedp.Evaluate(`document.documentElement.scrollWidth`, &scroll)); err != nil {
			t.Fatal(err)
		}
		if scroll > width {
			var widest string
			chromedp.Run(ctx, chromedp.Evaluate(`(() => { let w = null, r = 0;
				for (const e of document.querySelectorAll('body *')) { const b = e.getBoundingClientRect().right; if (b > r) { r = b; w = e; } }
				return w ? w.tagName + '.' + w.className + ' ' + w.textContent.slice(0, 80) + ' → ' + r : '' })()`, &widest))
			t.Errorf("%s at %d px: the page is %d px wide, something does not wrap (%s)", label, width, scroll, widest)
		}
		browsertest.Screenshot(ctx, t, fmt.Sprintf("%s-%d", label, width))
	}
}
