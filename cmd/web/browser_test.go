package main

import (
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
	if n != 7*8*3 {
		t.Errorf("grid shows %d slots", n)
	}
	browsertest.Screenshot(ctx, t, "slots")
}
