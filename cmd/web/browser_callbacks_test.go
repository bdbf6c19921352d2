package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/webhook"
)

// The Provider page's Callbacks section and the operation page, after the
// provider called back twice (duplicate mode) about an answer that was lost,
// (the first push deferred while the request still waited: 409, pushed
// again) and once about a key no step has: the ledger shows the applied event with
// its extra copy, the stray one is kept for a person, and the operation's
// calls say the provider called back. At 1280 and 390 px.
func TestBrowserCallbacksOnTheProviderAndOperationPages(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "1h", "WEBHOOK_SECRET": "browser-secret"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	if r := s.do(request{Method: "PUT", Path: "/api/v1/provider/webhooks", Token: "demo-admin",
		Body: `{"mode": "duplicate"}`}); r.Status != 200 {
		t.Fatalf("webhooks: %d %s", r.Status, r.Body)
	}
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "browser-cb", `{"reason":"moving abroad"}`))
	var op struct{ ID int64 }
	r.JSON(t, &op)
	waitUntil(t, 10*time.Second, func() bool {
		var st struct{ Status string }
		s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op.ID), Token: "demo-alice"}).JSON(t, &st)
		return st.Status == "SUCCEEDED"
	})
	// A stray callback: signed, for a key the app never sent.
	body := []byte(`{"id":"evt_stray","key":"9999:provider_cancel","status":"COMPLETED","occurred_at":"2026-01-01T00:00:00Z","attempt":1}`)
	stray := request{Method: "POST", Path: "/webhooks/provider", Body: string(body), Header: map[string]string{}}
	h := map[string][]string{}
	webhook.SetHeaders(h, []byte("browser-secret"), "evt_stray", time.Now(), body)
	for k, v := range h {
		stray.Header[k] = v[0]
	}
	if r := s.do(stray); r.Status != 200 {
		t.Fatalf("stray callback: %d %s", r.Status, r.Body)
	}

	ctx := browsertest.New(t)
	var kept, ledger, calls string
	err := chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/provider"),
		chromedp.Text(`[data-testid="callbacks-kept"]`, &kept, chromedp.ByQuery),
		chromedp.Text(`[data-testid="webhook-ledger"]`, &ledger, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(kept, "9999:provider_cancel") {
		t.Errorf("the stray callback is not kept for a person: %q", kept)
	}
	if !strings.Contains(ledger, "applied") || !strings.Contains(ledger, "1 more copies") {
		t.Errorf("the webhook ledger: %q", ledger)
	}
	shoot(t, ctx, "provider-callbacks")
	err = chromedp.Run(ctx,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, op.ID)),
		chromedp.Text(`tr[data-kind="callback"]`, &calls, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(calls, "called back COMPLETED") || !strings.Contains(calls, "delivery attempt") {
		t.Errorf("the operation's callback line: %q", calls)
	}
	shoot(t, ctx, "operation-callback")
}

// The webhooks lab in the browser: three broken handlers beside the
// correct one, at 1280 and 390 px.
func TestBrowserWebhooksLab(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	browseLabs(t, []string{"webhooks"})
}

// The ordering lab in the browser: the naive projection ends wrong beside
// the versioned one, at 1280 and 390 px.
func TestBrowserOrderingLab(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	browseLabs(t, []string{"ordering"})
}

// The Events page says how often the history consumer restored order:
// an event applied after parking is counted, at 1280 and 390 px.
func TestBrowserEventsPageCountsParkedEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_TRANSPORT": "river"})
	// One booking whose release came before its confirmation: parked, then
	// applied after it (what events.History writes).
	_, err := s.DB.Pool.Exec(context.Background(), `
		WITH h AS (INSERT INTO histories (key, version, state) VALUES ('booking:1', 2, 'released'))
		INSERT INTO history_events (key, seq, event_id, type, parked_at)
		VALUES ('booking:1', 1, gen_random_uuid(), 'booking.confirmed', NULL),
		       ('booking:1', 2, gen_random_uuid(), 'booking.released', now())`)
	if err != nil {
		t.Fatal(err)
	}
	ctx := browsertest.New(t)
	var parked string
	if err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		// The signed-in page, not any body: the sign-in page's own body is
		// visible at once, and a Navigate during the sign-in's navigation
		// aborts it (net::ERR_ABORTED).
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/events"),
		chromedp.Text(`[data-testid="history-parked-then-applied"]`, &parked, chromedp.ByQuery),
	); err != nil {
		t.Fatal(err)
	}
	if parked != "1" {
		t.Errorf("parked then applied: %q, want 1", parked)
	}
	shoot(t, ctx, "events-history")
}
