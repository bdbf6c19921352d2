package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
)

// Every numbered lab, run once from its page: the result table has one row
// per variant, every broken variant broke and every correct one held, and
// the page fits 1280 and 390 px. Three browsers, so each stays within the
// browser's time bound on a loaded machine.
func TestBrowserLabsOneToFive(t *testing.T) {
	t.Parallel()
	browseLabs(t, []string{"redis", "fencing", "claim", "inbox", "relay"})
}

func TestBrowserLabsSixToNine(t *testing.T) {
	t.Parallel()
	browseLabs(t, []string{"null-unique", "compensation", "belief", "status"})
}

func browseLabs(t *testing.T, names []string) {
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "off", "EVENTS_TRANSPORT": "river"})
	ctx := browsertest.New(t)
	if err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs"),
		chromedp.WaitVisible(`[data-testid="labs"]`, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, "index")
	for _, name := range names {
		runLabInBrowser(t, ctx, s, name)
	}
}

// runLabInBrowser opens the lab from the index, presses Run and checks the
// result: broken variants broke, correct ones held.
func runLabInBrowser(t *testing.T, ctx context.Context, s *testServer, name string) {
	t.Helper()
	var broken, correct, rows int
	var lesson, listed, summary string
	err := chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/labs"),
		chromedp.Text(`[data-lab="`+name+`"] [data-testid="lab-summary"]`, &listed, chromedp.ByQuery),
		chromedp.Click(`[data-lab="`+name+`"] a`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="lab-lesson"]`, &lesson, chromedp.ByQuery),
		chromedp.Text(`[data-testid="lab-summary"]`, &summary, chromedp.ByQuery),
		chromedp.Click(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-result"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr').length`, &rows),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr[data-held=false]').length`, &broken),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr[data-held=true]').length`, &correct),
	)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if listed == "" || listed != summary { // issue 29's second read, finding 12
		t.Errorf("%s: the labs' index says %q, the lab's page %q", name, listed, summary)
	}
	if lesson == "" || rows < 2 || broken == 0 || correct == 0 {
		t.Errorf("%s: %d variants, %d broke, %d held", name, rows, broken, correct)
	}
	var timelines int
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-timeline]').length`, &timelines))
	if timelines != rows {
		t.Errorf("%s: %d timelines for %d variants", name, timelines, rows)
	}
	shoot(t, ctx, name)
}

// The timeout lab: one click, three operations side by side, refreshed
// until recovery has finished each; the provider cancelled each policy
// once. And the race lab's two columns become one on a phone.
func TestBrowserTimeoutLabAndTheRaceLabOnAPhone(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{
		"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "200ms", "RECOVERY_POLL_INTERVAL": "200ms",
		"OPERATION_LEASE": "2s", "EVENTS_TRANSPORT": "river",
	})
	ctx := browsertest.New(t)
	var cards int
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs/timeouts"),
		chromedp.Click(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-operations"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-operation]').length`, &cards),
	)
	if err != nil {
		t.Fatal(err)
	}
	if cards != 3 {
		t.Fatalf("%d operations shown", cards)
	}
	shoot(t, ctx, "timeouts-running")
	waitCtx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	var effects string
	err = chromedp.Run(waitCtx,
		chromedp.WaitVisible(`[data-testid="lab-operations"][data-live="false"]`, chromedp.ByQuery), // swapped in by htmx
		chromedp.Evaluate(`[...document.querySelectorAll('[data-testid=lab-provider-effects]')].map(e => e.textContent).join('|')`, &effects),
	)
	if err != nil {
		t.Fatalf("recovery did not finish the three operations: %v", err)
	}
	var succeeded int
	chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-operation][data-status=SUCCEEDED]').length`, &succeeded))
	if succeeded != 3 || strings.Count(effects, "1 cancellation") != 3 {
		t.Errorf("%d operations SUCCEEDED; the provider: %s", succeeded, effects)
	}
	shoot(t, ctx, "timeouts-finished")
	s.assertInvariants(t)

	// The race lab at 390 px: the form, then the tips, one under the other.
	var columns string
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/labs/race"),
		chromedp.WaitVisible(`[data-testid="race-form"]`, chromedp.ByQuery),
		chromedp.EmulateViewport(390, 900),
		chromedp.Evaluate(`getComputedStyle(document.querySelector('.grid.race-lab')).gridTemplateColumns`, &columns),
	)
	if err != nil {
		t.Fatal(err)
	}
	if len(strings.Fields(columns)) != 1 {
		t.Errorf("the race lab at 390 px has columns %q, want one", columns)
	}
	shoot(t, ctx, "race-lab")
}

// The failover lab from its page: the "try this", one Run (a private
// primary and standby, three failovers), a row per setting — both
// asynchronous rows broke, the synchronous one held — with the lost answers
// highlighted; at 1280 and 390 px. Then a server without the binaries: the
// page says what is missing and Run is off.
func TestBrowserFailoverLab(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "off"})
	ctx := browsertest.New(t)
	var try string
	var rows, broken, held, badCells int
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs"),
		chromedp.Click(`[data-lab="failover"] a`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.Text(`.intro-try`, &try, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(try, "stored answers lost") || !strings.Contains(try, "executed twice") {
		t.Errorf("the try-this does not name the counts to compare: %q", try)
	}
	shoot(t, ctx, "failover-before")
	err = chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-result"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr').length`, &rows),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr[data-held=false]').length`, &broken),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] tbody tr[data-held=true][data-variant=sync]').length`, &held),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid=lab-table] td.lab-bad[data-label="stored answers lost"]').length`, &badCells),
	)
	if err != nil {
		t.Fatal(err)
	}
	if rows != 3 || broken != 2 || held != 1 || badCells != 2 {
		t.Errorf("%d rows, %d broke, synchronous held: %d, %d lost-answer cells highlighted; want 3, 2, 1, 2", rows, broken, held, badCells)
	}
	shoot(t, ctx, "failover-result")

	bare := startServer(t, map[string]string{"POSTGRES_BIN_DIR": t.TempDir()})
	var why string
	var disabled bool
	err = chromedp.Run(ctx,
		chromedp.Navigate(bare.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(bare.URL+"/labs/failover"),
		chromedp.Text(`[data-testid="lab-unavailable"]`, &why, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelector('[data-testid=lab-run]').disabled`, &disabled),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(why, "pg_basebackup") || !strings.Contains(why, "initdb") || !disabled {
		t.Errorf("without the binaries the page says %q (Run disabled: %v)", why, disabled)
	}
	shoot(t, ctx, "failover-unavailable")
}
