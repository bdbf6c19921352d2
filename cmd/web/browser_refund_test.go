package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/payments"
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
	// The truth beside the key is not recorded: the page asks payments when
	// it renders ("asked just now"), within a second for all the systems
	// and PAYMENTS_TIMEOUT for each. On a loaded machine that ask can go
	// unanswered, and the page says so: UNKNOWN, "could not be asked just
	// now", and the reason. That is the other correct answer, and the
	// SUCCEEDED page no longer refreshes; then this test asks payments
	// itself, with time to answer, and the truth must be COMPLETED.
	if refund != "DONE" || !strings.HasSuffix(key, ":refund") {
		t.Errorf("after recovery: refund %s, truth %q, key %q", refund, truth, key)
	}
	if !strings.Contains(truth, "COMPLETED") {
		var box string
		if err := chromedp.Run(ctx, chromedp.Text(`[data-testid="step-refund"] .truth-box`, &box, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(truth, "UNKNOWN") || !strings.Contains(box, "could not be asked just now") {
			t.Errorf("after recovery: refund %s, truth %q (%q), key %q", refund, truth, box, key)
		}
		pay := payments.NewHTTPClient(s.PaymentsURL, 30*time.Second)
		defer pay.CloseIdleConnections()
		now, err := pay.RefundStatus(context.Background(), strings.TrimSpace(key))
		if err != nil || now != external.TruthCompleted {
			t.Errorf("the page could not ask payments (%q); asked with time to answer, payments says %q (%v)", box, now, err)
		}
	}
	// alice reads recovery as the actor, not the instance it ran on (redact.go).
	if !strings.Contains(timeline, "claimed for recovery") || strings.Contains(timeline, "on app-1") {
		t.Errorf("the timeline does not show recovery's work, or names its instance to a customer: %q", timeline)
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
		if err := chromedp.Run(ctx, chromedp.EmulateViewport(width, 900)); err != nil {
			t.Fatal(err)
		}
		// An operation page is loaded again when its status changes (the
		// panel's refresh answers HX-Refresh): for a moment there is no
		// document, or one without its stylesheet, wider than any styled
		// page. Measure a page that has finished loading, in one evaluation.
		var scroll int64
		var lastErr error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			lastErr = chromedp.Run(ctx, chromedp.Evaluate(`document.readyState === 'complete' && document.documentElement
				? document.documentElement.scrollWidth : -1`, &scroll))
			if lastErr == nil && scroll >= 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s at %d px: no loaded page to measure (%v)", label, width, lastErr)
			}
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
