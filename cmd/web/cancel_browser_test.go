package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

func TestBrowserCancelAPolicy(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "500ms"})
	ctx := browsertest.New(t)
	pid := s.policyOf(t, "demo-alice", 0)

	var status, truth string
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/policies/"+itoa64(pid)),
		chromedp.SendKeys(`input[name="reason"]`, "moving abroad", chromedp.ByQuery),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="operation-status"]`, &status, chromedp.ByQuery),
		chromedp.Text(`[data-testid="truth-provider_cancel"]`, &truth, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status, "SUCCEEDED") || !strings.Contains(truth, "COMPLETED") {
		t.Errorf("operation page: status %q, truth %q", status, truth)
	}
	browsertest.Screenshot(ctx, t, "succeeded")

	// lost_response: the provider applies the cancellation, the answer never
	// comes back. The page opens on the gap — local IN_PROGRESS — and keeps
	// refreshing itself until the recovery loop has asked the provider and
	// finished the operation.
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	pid2 := s.policyOf(t, "demo-alice", 1)
	var first string
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/policies/"+itoa64(pid2)),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="operation-panel"]`, "data-status", &first, nil, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	browsertest.Screenshot(ctx, t, "lost-response")
	if first != "IN_PROGRESS" && first != "RECOVERING" && first != "SUCCEEDED" {
		t.Errorf("lost_response: the page opened on %q", first)
	}
	err = chromedp.Run(ctx,
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="truth-provider_cancel"]`, &truth, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(truth, "COMPLETED") {
		t.Errorf("lost_response, recovered: provider truth %q", truth)
	}
	if n := s.effects(t, pid2); n != 1 {
		t.Errorf("lost_response: %d provider effects", n)
	}
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

func TestBrowserDoubleClickLab(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	ctx := browsertest.New(t)
	p1, p2 := s.policyOf(t, "demo-bob", 0), s.policyOf(t, "demo-bob", 1)
	if err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-bob"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy       int64
		button, keys string
		replayed     bool
	}{
		{p1, "lab-same-key", "1", true},
		{p2, "lab-two-keys", "2", false},
	} {
		var keys, ops, effects, result string
		err := chromedp.Run(ctx,
			chromedp.Navigate(s.URL+"/policies/"+itoa64(tc.policy)),
			chromedp.Click(`[data-testid="`+tc.button+`"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`[data-testid="lab-verdict"]`, chromedp.ByQuery),
			chromedp.Text(`[data-testid="lab-keys"]`, &keys, chromedp.ByQuery),
			chromedp.Text(`[data-testid="lab-operations"]`, &ops, chromedp.ByQuery),
			chromedp.Text(`[data-testid="lab-effects"]`, &effects, chromedp.ByQuery),
			chromedp.Text(`[data-testid="lab-result"]`, &result, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(keys) != tc.keys || !strings.HasPrefix(strings.TrimSpace(ops), "1") || strings.TrimSpace(effects) != "1" {
			t.Errorf("%s: keys %q, operations %q, effects %q", tc.button, keys, ops, effects)
		}
		if strings.Contains(result, "Idempotent-Replayed") != tc.replayed {
			t.Errorf("%s: replayed shown %v in %q", tc.button, !tc.replayed, result)
		}
		// its result fits a phone (issue 29, finding 20)
		shoot(t, ctx, tc.button)
		chromedp.Run(ctx, chromedp.EmulateViewport(1280, 900))
	}
	s.assertInvariants(t)
}
