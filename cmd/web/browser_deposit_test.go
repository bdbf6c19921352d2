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

// The deposit saga on screen. Alice books a studio slot while the payments
// service is slow: her booking page shows the hold and the charge in doubt,
// and the grid shows the slot held, until when. Then she books another while
// payments declines: the page shows the charge FAILED and the hold released
// — the compensation — and the grid shows that slot free again.
// Screenshots at 1280 and 390 px.
func TestBrowserADeclinedDepositIsCompensatedOnScreen(t *testing.T) {
	t.Parallel()
	// The app waits 2 s for payments: the slow charge outlasts it, a
	// refusal on a loaded machine does not.
	s := startServer(t, map[string]string{"PAYMENTS_TIMEOUT": "2s", "INSTANCE_ID": "app-1"})
	ctl := paymentsfake.NewControl(s.PaymentsURL, "")
	defer ctl.CloseIdleConnections()
	setMode := func(mode fault.Mode) {
		t.Helper()
		f := fault.Default()
		f.Mode, f.SlowMS = mode, 120_000
		if _, err := ctl.SetFaults(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
	inDoubt, declined := depositSlot(t, s.DB, 0), depositSlot(t, s.DB, 1)
	ctx := browsertest.New(t)
	bookFromGrid := func(slotID int64) {
		t.Helper()
		err := chromedp.Run(ctx,
			chromedp.Navigate(s.URL+"/slots"),
			chromedp.Click(fmt.Sprintf(`button[data-slot-id="%d"]`, slotID), chromedp.ByQuery),
			chromedp.WaitVisible(`[data-testid="booking"]`, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}

	// Slow: the charge is accepted and still running when the app stops waiting.
	setMode(fault.ModeSlow)
	bookFromGrid(inDoubt)
	var status, heldUntil string
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(`[data-testid="step-charge_deposit"]:not([data-state="PENDING"]):not([data-state="DONE"])`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="booking"]`, "data-status", &status, nil, chromedp.ByQuery),
		chromedp.Text(`[data-testid="held-until"]`, &heldUntil, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if status != "PENDING" || !strings.Contains(heldUntil, "UTC") {
		t.Errorf("a deposit in doubt: booking %s, held until %q", status, heldUntil)
	}
	shoot(t, ctx, "deposit-in-doubt")

	// Declined: the hold is released in the commit that records the refusal.
	setMode(fault.ModeReject)
	bookFromGrid(declined)
	var charge, hold, timeline, compensated string
	if err := chromedp.Run(ctx,
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="FAILED"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="booking"]`, "data-status", &status, nil, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="step-charge_deposit"]`, "data-state", &charge, nil, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="step-hold"]`, "data-state", &hold, nil, chromedp.ByQuery),
		chromedp.Text(`[data-testid="compensated"]`, &compensated, chromedp.ByQuery),
		chromedp.Text(`[data-testid="timeline"]`, &timeline, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if status != "FAILED" || charge != "FAILED" || hold != "DONE" || !strings.Contains(timeline, "hold undone") ||
		!strings.Contains(compensated, "released") {
		t.Errorf("declined: booking %s, charge %s, hold %s, timeline %q", status, charge, hold, timeline)
	}
	shoot(t, ctx, "deposit-declined")

	// The grid: the slot in doubt still held, until when; the declined one free.
	var heldState, freeState, heldText string
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(waitCtx,
		chromedp.Navigate(s.URL+"/slots"),
		chromedp.WaitVisible(`[data-testid="slot-grid"]`, chromedp.ByQuery),
		chromedp.AttributeValue(fmt.Sprintf(`[data-slot-id="%d"]`, inDoubt), "data-state", &heldState, nil, chromedp.ByQuery),
		chromedp.Text(fmt.Sprintf(`[data-slot-id="%d"]`, inDoubt), &heldText, chromedp.ByQuery),
		chromedp.AttributeValue(fmt.Sprintf(`[data-slot-id="%d"]`, declined), "data-state", &freeState, nil, chromedp.ByQuery),
		chromedp.ScrollIntoView(fmt.Sprintf(`[data-slot-id="%d"]`, inDoubt), chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if heldState != "held-mine" || !strings.Contains(heldText, "until") || freeState != "free" {
		t.Errorf("grid: in doubt %s (%q), declined %s", heldState, heldText, freeState)
	}
	shoot(t, ctx, "deposit-grid")
	s.assertInvariants(t)
}
