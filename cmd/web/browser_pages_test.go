package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
)

// The headline scenario, made from the pages alone (issue 29): an admin arms
// after_provider_cancel on Demo controls, a customer cancels a policy and
// the request is cut off after the provider applied the call; the Recovery
// page offers to let the dead owner's lease run out now, and recovery
// claims the operation — "its owner's lease ran out" — asks the provider,
// and finishes it without a second call.
func TestBrowserCrashAfterTheEffectThenLetTheLeaseRunOut(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{
		"OPERATION_LEASE":   "60s", // far longer than the test: only the button ends it
		"RECOVERY_INTERVAL": "100ms",
		"INSTANCE_ID":       "app-1",
	})
	ctx := browsertest.New(t)
	bg := context.Background()
	var policyID int64
	if err := s.DB.Pool.QueryRow(bg,
		`SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id WHERE u.name = 'alice' ORDER BY p.id LIMIT 1`).Scan(&policyID); err != nil {
		t.Fatal(err)
	}

	// Arm the crash point from Demo controls.
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/admin/demo"),
		chromedp.SetValue(`[data-testid="crash-at"]`, "after_provider_cancel", chromedp.ByQuery),
		chromedp.Click(`[data-testid="crash-submit"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="crash-armed"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, "demo-crash-armed")

	// Alice cancels: the request dies after the provider's effect.
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(fmt.Sprintf("%s/policies/%d", s.URL, policyID)),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	var opID int64
	var status, step string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		err := s.DB.Pool.QueryRow(bg, `
			SELECT o.id, o.status, s.state
			  FROM operations o JOIN operation_steps s ON s.operation_id = o.id AND s.name = 'provider_cancel'
			 WHERE o.policy_id = $1`, policyID).Scan(&opID, &status, &step)
		if err == nil && step == "SENT" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != "IN_PROGRESS" || step != "SENT" {
		t.Fatalf("after the crash: operation %d %s, provider_cancel %s; want IN_PROGRESS, SENT", opID, status, step)
	}

	// The admin lets its lease run out from the Recovery page.
	button := fmt.Sprintf(`form[action="/admin/operations/%d/end-lease"] button`, opID)
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/recovery"),
		chromedp.WaitVisible(button, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, "recovery-end-lease") // ends at 390 px
	// On a phone the control is in sight, not at the far end of a table
	// that scrolls sideways.
	var right float64
	if err := chromedp.Run(ctx, chromedp.Evaluate(`document.querySelector('`+button+`').getBoundingClientRect().right`, &right)); err != nil {
		t.Fatal(err)
	}
	if right > 390 {
		t.Errorf("at 390 px %q ends at %.0f px: out of sight", "Let its lease run out now", right)
	}
	if err := chromedp.Run(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Run(ctx, chromedp.Click(button, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"][data-status="SUCCEEDED"]`, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	timeline := text(t, ctx, `[data-testid="timeline"]`)
	for _, want := range []string{"lease ended now", "its owner's lease ran out", "COMPLETED"} {
		if !strings.Contains(timeline, want) {
			t.Errorf("the timeline does not say %q:\n%s", want, timeline)
		}
	}
	var effects int
	s.DB.Pool.QueryRow(bg, `SELECT count(*) FROM fake_provider.effects WHERE policy_id = $1`, policyID).Scan(&effects)
	if effects != 1 {
		t.Errorf("the provider applied %d cancellations, want 1", effects)
	}
	shoot(t, ctx, "operation-after-lease")
}

// The pages issue 29 added, and the home page that leads to them, at 1280
// and 390 px: each renders, says what it is for, and fits a phone.
func TestBrowserIdeasAndDocsPages(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, nil)
	ctx := browsertest.New(t)
	for _, p := range []struct{ path, label, want string }{
		{"/", "home", "Retry is not recovery"},
		{"/ideas/retry-is-not-recovery", "retry-vs-recovery", "What makes it safe"},
		{"/ideas/crash-between-effect-and-record", "crash-window", "What recovery asks"},
		{"/docs/", "docs-index", "Recovery"},
		{"/docs/recovery", "doc-recovery", "The decision tree"},
		{"/docs/README", "doc-readme", "How to read this code"},
		// the code viewer's breadcrumb, deep in the tree (issue 29, finding 20)
		{"/code/internal/payments/fake/control.go", "code-file-deep", "control.go"},
		{"/code/internal/readmodel/", "code-dir-deep", "readmodel"},
	} {
		var body string
		err := chromedp.Run(ctx,
			chromedp.Navigate(s.URL+p.path),
			chromedp.WaitVisible(`main`, chromedp.ByQuery),
			chromedp.Text(`main`, &body, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatalf("%s: %v", p.path, err)
		}
		if !strings.Contains(strings.ToLower(body), strings.ToLower(p.want)) {
			t.Errorf("%s does not say %q", p.path, p.want)
		}
		shoot(t, ctx, p.label)
	}
	// A link of a doc leads to another doc, not to a file a browser cannot open.
	var href string
	var ok bool
	if err := chromedp.Run(ctx, chromedp.Navigate(s.URL+"/docs/recovery"),
		chromedp.AttributeValue(`article.doc a[href^="/docs/"]`, "href", &href, &ok, chromedp.ByQuery)); err != nil || !ok {
		t.Fatalf("no link to another doc in /docs/recovery: %v", err)
	}
}

// The labs' limit in a browser (issue 29, finding 22): the second run of a
// minute with RATE_LIMIT_LABS=1/m lands on a 429 page that says when to try
// again and leads back to the lab, at 1280 and 390 px.
func TestBrowserLabLimitSaysWhenAndLeadsBack(t *testing.T) {
	if testing.Short() {
		t.Skip("browser test")
	}
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "1/m"})
	ctx := browsertest.New(t)
	var back string
	var ok bool
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs/claim"),
		chromedp.Click(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="lab-table"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs/claim"),
		chromedp.Click(`[data-testid="lab-run"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="rate-limited"]`, chromedp.ByQuery),
		chromedp.AttributeValue(`[data-testid="rate-limited-back"]`, "href", &back, &ok, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if back != "/labs/claim" {
		t.Errorf("the 429 page leads back to %q, want /labs/claim", back)
	}
	if !strings.Contains(text(t, ctx, `[data-testid="retry-at"]`), "Try again in") {
		t.Errorf("the 429 page does not say when to try again")
	}
	shoot(t, ctx, "lab-limit")
}
