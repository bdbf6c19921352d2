package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
)

func TestBrowserSignInSeePoliciesSignOut(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	ctx := browsertest.New(t)

	var who, table, nav string
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		chromedp.Text(`[data-testid="policies"]`, &table, chromedp.ByQuery),
		chromedp.Text(`header nav`, &nav, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(who, "alice") {
		t.Errorf("signed in as %q", who)
	}
	if !strings.Contains(table, "POL-ALICE-001") || strings.Contains(table, "POL-BOB") {
		t.Errorf("policies table: %q", table)
	}
	browsertest.Screenshot(ctx, t, "policies")

	var signinLink string
	err = chromedp.Run(ctx,
		chromedp.Click(`[data-testid="sign-out"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`a[href="/signin"]`, chromedp.ByQuery),
		chromedp.Text(`header nav`, &signinLink, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/policies"),
		chromedp.WaitVisible(`[data-testid="signin-alice"]`, chromedp.ByQuery), // sent back to sign in
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(signinLink, "alice") {
		t.Errorf("still signed in after sign out: %q", signinLink)
	}
}

func TestBrowserSlotsGrid(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	ctx := browsertest.New(t)
	var n int
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-bob"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/slots"),
		chromedp.WaitVisible(`[data-testid="slot-grid"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll("[data-slot-id]").length`, &n),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n != 7*8*4 { // three resources and the recording studio (deposit)
		t.Errorf("grid shows %d slots", n)
	}
	browsertest.Screenshot(ctx, t, "slots")
}

func TestBrowserBookReleaseAndRaceLab(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	ctx := browsertest.New(t)
	slotID := freeSlot(t, s.DB, 2)
	cell := fmt.Sprintf(`[data-slot-id="%d"]`, slotID)

	var state, flash string
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/slots"),
		chromedp.Click(cell+`[data-state="free"]`, chromedp.ByQuery),
		chromedp.WaitVisible(cell+`[data-state="mine"]`, chromedp.ByQuery),
		chromedp.AttributeValue(cell, "data-state", &state, nil, chromedp.ByQuery),
		chromedp.Text(`.flash`, &flash, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if state != "mine" || !strings.Contains(flash, "Booked") {
		t.Fatalf("after Book: state %q, flash %q", state, flash)
	}
	browsertest.Screenshot(ctx, t, "slots-booked")

	err = browsertest.Run(ctx,
		chromedp.Click(cell+`[data-state="mine"]`, chromedp.ByQuery),
		chromedp.WaitVisible(cell+`[data-state="free"]`, chromedp.ByQuery),
		chromedp.Text(`.flash`, &flash, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(flash, "Released") {
		t.Fatalf("after Release: flash %q", flash)
	}
	assertInvariant3(t, s.DB)

	// The race lab: 16 users, the naive strategy, a 50 ms window.
	var verdict, won, rows string
	err = browsertest.Run(ctx,
		chromedp.Click(`header nav a[href="/labs"]`, chromedp.ByQuery),
		chromedp.Click(`a[href="/labs/race"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="race-form"]`, chromedp.ByQuery),
		chromedp.SetValue(`[data-testid="race-racers"]`, "16", chromedp.ByQuery),
		chromedp.SetValue(`[data-testid="race-think"]`, "50", chromedp.ByQuery),
		chromedp.Click(`[data-testid="race-strategy-check-then-insert"]`, chromedp.ByQuery),
		chromedp.Click(`[data-testid="race-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="race-verdict"]`, chromedp.ByQuery), // swapped in by htmx
		chromedp.Text(`[data-testid="race-verdict"]`, &verdict, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="race-verdict"]`, "data-won", &won, nil, chromedp.ByQuery),
		chromedp.Evaluate(`String(document.querySelectorAll("[data-testid=race-table] tbody tr").length)`, &rows),
	)
	if err != nil {
		t.Fatal(err)
	}
	if won != "1" || rows != "16" || !strings.HasPrefix(verdict, "1 winner, 15 refused") {
		t.Fatalf("race: won %s, %s rows, verdict %q", won, rows, verdict)
	}
	browsertest.Screenshot(ctx, t, "race-lab")
	assertInvariant3(t, s.DB)
}
