package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/provider"
)

// Defect 2 of issue 17: the provider's ledger says how many times a policy
// was cancelled, not "twice" for any number. Defect 6: the race lab's hint
// about select-for-update says what its own results show. Defect 4: the
// recovery page's settings stay open while the page refreshes itself.
func TestBrowserLedgerCountsAndRaceLabHint(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "PUT", Path: "/api/v1/provider/faults", Token: "demo-admin",
		Body: `{"mode": "ok", "idempotent": false}`}); r.Status != 200 {
		t.Fatalf("faults: %d %s", r.Status, r.Body)
	}
	// A blind retry, three times, at a provider that is not idempotent.
	pid := s.policyOf(t, "demo-alice", 0)
	client := provider.NewHTTPClient(s.ProviderURL, 2*time.Second)
	defer client.CloseIdleConnections()
	for range 3 {
		if _, err := client.Cancel(context.Background(), provider.CancelRequest{Key: "blind-retry", PolicyID: pid, Deadline: client.Deadline()}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.effects(t, pid); n != 3 {
		t.Fatalf("%d effects", n)
	}
	ctx := browsertest.New(t)
	var badge, hint string
	err := chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/provider"),
		chromedp.Text(`[data-testid="duplicate-`+itoa64(pid)+`"]`, &badge, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(badge) != "cancelled 3 times" {
		t.Errorf("the ledger's badge for 3 effects: %q", badge)
	}
	// (Only a screenshot: the provider page at 390 px is part B's.)
	for _, w := range []int64{1280, 390} {
		chromedp.Run(ctx, chromedp.EmulateViewport(w, 900))
		browsertest.Screenshot(ctx, t, "provider-ledger-"+itoa64(w))
	}

	// select-for-update, 6 racers, 200 ms of think time: the winner holds
	// the lock while it thinks; each loser, given the lock, finds the slot
	// booked and gives up — so no loser waits a second think time (were
	// the waits to grow in steps, they would be 200, 400, … 1000 ms).
	var waits []string
	err = chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/labs/race"),
		chromedp.Text(`[data-testid="hint-select-for-update"]`, &hint, chromedp.ByQuery),
		chromedp.SetValue(`[data-testid="race-racers"]`, "6", chromedp.ByQuery),
		chromedp.SetValue(`[data-testid="race-think"]`, "200", chromedp.ByQuery),
		chromedp.Click(`[data-testid="race-strategy-select-for-update"]`, chromedp.ByQuery),
		chromedp.Click(`[data-testid="race-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="race-verdict"]`, chromedp.ByQuery),
		chromedp.Evaluate(`[...document.querySelectorAll('[data-testid=race-table] tbody tr[data-outcome=refused] td.wait .num')].map(e => e.textContent)`, &waits),
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(hint, "grow in steps") || !strings.Contains(hint, "about one think time") {
		t.Errorf("the hint: %q", hint)
	}
	t.Logf("losers' waits: %v", waits)
	if len(waits) != 5 {
		t.Fatalf("losers' waits: %v", waits)
	}
	var ds []time.Duration
	for _, w := range waits {
		d, err := time.ParseDuration(strings.ReplaceAll(w, " ", ""))
		if err != nil {
			t.Fatalf("wait %q: %v", w, err)
		}
		ds = append(ds, d)
	}
	// Steps of the think time would put 200 ms between one loser's wait and
	// the next; one release puts a few. The median gap tells them apart even
	// if one racer started late (a loaded machine) and waited less.
	slices.Sort(ds)
	var gaps []time.Duration
	for i := 1; i < len(ds); i++ {
		gaps = append(gaps, ds[i]-ds[i-1])
	}
	slices.Sort(gaps)
	if median := gaps[len(gaps)/2]; median >= 100*time.Millisecond {
		t.Errorf("the losers' waits grow in steps (median gap %s): %v", median, waits)
	}
	shoot(t, ctx, "race-select-for-update")

	// Defect 4: the recovery page's settings stay open across its refreshes.
	var open bool
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/recovery"),
		chromedp.Evaluate(`window.swaps = 0; document.addEventListener('htmx:afterSwap', () => window.swaps++); true`, nil),
		chromedp.Click(`#recovery-settings summary`, chromedp.ByQuery),
		chromedp.Poll(`window.swaps >= 1`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(`document.querySelector('#recovery-settings').open`, &open),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !open {
		t.Error("the recovery page's settings closed themselves at its refresh")
	}
}
