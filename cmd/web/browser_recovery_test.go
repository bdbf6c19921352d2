package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
)

// recoveryEnv makes recovery fast enough to watch in a test: short lease,
// frequent passes, a provider slower than the app waits.
var recoveryEnv = map[string]string{
	"PROVIDER_FAULT_MODE":    "slow", // RUNNING for 5s
	"PROVIDER_TIMEOUT":       "300ms",
	"OPERATION_LEASE":        "1s",
	"RECOVERY_INTERVAL":      "100ms",
	"RECOVERY_POLL_INTERVAL": "300ms",
	"RECOVERY_MAX_POLLS":     "8",
	"INSTANCE_ID":            "app-1",
}

// A customer cancels while the provider is slow, and watches the operation
// page go IN_PROGRESS → RECOVERING → SUCCEEDED as the recovery loop polls
// the provider and finishes it.
func TestBrowserWatchRecoveryFinishACancellation(t *testing.T) {
	t.Parallel()
	s := startServer(t, recoveryEnv)
	ctx := browsertest.New(t)
	var policyID int64
	if err := s.DB.Pool.QueryRow(context.Background(),
		`SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id WHERE u.name = 'alice' ORDER BY p.id LIMIT 1`).Scan(&policyID); err != nil {
		t.Fatal(err)
	}
	err := chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(fmt.Sprintf("%s/policies/%d", s.URL, policyID)),
		chromedp.Click(`[data-testid="cancel-button"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="operation-panel"], [data-testid="notice"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	// Chromium may send the form a second time (seen at load 12: a request
	// on a reused connection is retried), and the second submission is
	// rightly told the first still holds the form's key (the notice page).
	// The reader then opens the operation, as the notice says.
	var onNotice int
	if err := chromedp.Run(ctx, chromedp.Evaluate(`document.querySelectorAll('[data-testid="notice"]').length`, &onNotice)); err != nil {
		t.Fatal(err)
	}
	if onNotice > 0 {
		var opID int64
		if err := s.DB.Pool.QueryRow(context.Background(), `SELECT id FROM operations WHERE policy_id = $1`, policyID).Scan(&opID); err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Run(ctx, chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, opID)),
			chromedp.WaitVisible(`[data-testid="operation-panel"]`, chromedp.ByQuery)); err != nil {
			t.Fatal(err)
		}
	}
	// Record every status the page shows until it is terminal. Polled from
	// here, not in the page: when the status changes, the panel's refresh
	// answers HX-Refresh and htmx loads the whole page again, so for a
	// moment there is no panel (or no page to evaluate in: chromedp says the
	// execution context went). Such a moment shows no status; the page
	// loaded again shows the next one. A page that never gets there fails
	// at the deadline with what it showed and the last error.
	var seen []string
	var lastErr error
	shot := false
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var status string
		if err := chromedp.Run(ctx, chromedp.Evaluate(`(() => {
			const p = document.querySelector('[data-testid="operation-panel"]');
			return p ? p.dataset.status : '';
		})()`, &status)); err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if status == "" { // between two pages
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if len(seen) == 0 || seen[len(seen)-1] != status {
			seen = append(seen, status)
		}
		if status == "RECOVERING" && !shot {
			browsertest.Screenshot(ctx, t, "operation-mid-recovery")
			shot = true
		}
		if status == "SUCCEEDED" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case slices.Equal(seen, []string{"IN_PROGRESS", "RECOVERING", "SUCCEEDED"}),
		slices.Equal(seen, []string{"RECOVERING", "SUCCEEDED"}):
	case onNotice > 0 && slices.Equal(seen, []string{"SUCCEEDED"}):
		// Opened after the notice, too late to watch: the timeline below
		// still has to show recovery finishing it.
	default:
		t.Fatalf("statuses seen: %v (last error reading the page: %v)", seen, lastErr)
	}
	// The page that showed SUCCEEDED may still be loaded again (HX-Refresh
	// for the new status): browsertest.Run reads the timeline that replaced it.
	var timeline string
	if err := browsertest.Run(ctx, chromedp.Text(`[data-testid="timeline"]`, &timeline, chromedp.ByQuery)); err != nil {
		t.Fatal(err)
	}
	// alice reads recovery as the actor, not the instance it ran on (redact.go).
	if !strings.Contains(timeline, "recovery") || strings.Contains(timeline, "on app-1") || !strings.Contains(timeline, "poll") {
		t.Errorf("timeline does not show the recovery: %q", timeline)
	}
	browsertest.Screenshot(ctx, t, "operation-recovered")

	var recent string
	err = browsertest.Run(ctx,
		chromedp.Navigate(s.URL+"/recovery"),
		chromedp.WaitVisible(`[data-testid="recent-recoveries"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="recent-recoveries"]`, &recent, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(recent, "completed") || !strings.Contains(recent, "claimed") {
		t.Errorf("recent recoveries: %q", recent)
	}
	shoot(t, ctx, "recovery-page") // at 1280 and 390 px: the tables scroll inside their box
}

// An admin resolves an operation recovery sent to reconciliation, and a
// decision on a state that changed meanwhile is refused with a clear notice.
func TestBrowserAdminResolvesAReconciliation(t *testing.T) {
	t.Parallel()
	s := startServer(t, recoveryEnv)
	ctx := browsertest.New(t)
	bg := context.Background()
	// Two cancellations recovery gave up on (as a non-idempotent provider
	// whose status could not be asked would leave them).
	var ids []int64
	rows, err := s.DB.Pool.Query(bg, `
		WITH o AS (
		    INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status, owner_token,
		                            owner_id, lease_expires_at, attempts, last_error, next_attempt_at)
		    SELECT p.id, 'CANCEL', p.user_id, 'k-' || p.id, 'NEEDS_RECONCILIATION', gen_random_uuid(),
		           'recovery on app-2', now(), 3,
		           'after 6 status queries (the first question, then 5 polls) the provider could not be asked, and the provider is not idempotent: a person must decide',
		           now() + interval '1 hour' -- not asked again during the test
		      FROM policies p JOIN users u ON u.id = p.user_id
		     WHERE u.name = 'bob'
		     ORDER BY p.id LIMIT 2
		    RETURNING id),
		steps AS (
		    INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state,
		                                 attempts, deadline_at, sent_at, request, finished_at)
		    SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system, s.state,
		           CASE WHEN s.system IS NOT NULL THEN 1 ELSE 0 END,
		           CASE WHEN s.state = 'UNKNOWN' THEN now() END, CASE WHEN s.state = 'UNKNOWN' THEN now() END,
		           CASE WHEN s.state = 'UNKNOWN' THEN '{}'::jsonb END, CASE WHEN s.state = 'DONE' THEN now() END
		      FROM o,
		           (VALUES (1, 'record_intent', NULL, 'DONE'), (2, 'provider_cancel', 'provider', 'UNKNOWN'),
		                   (3, 'mark_cancelled', NULL, 'PENDING'), (4, 'publish_event', NULL, 'PENDING'),
		                   (5, 'audit', NULL, 'PENDING')) AS s(position, name, system, state))
		SELECT id FROM o`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	if len(ids) != 2 {
		t.Fatalf("seeded %d operations", len(ids))
	}
	for _, id := range ids {
		s.DB.Pool.Exec(bg, `INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token,
			                                    detail, statement, branch, step)
			SELECT $1, line, ARRAY[line], '{RECOVERING}', '{NEEDS_RECONCILIATION}', '{recovery on app-2}', '{NULL}',
			       ARRAY['the provider could not be asked; not idempotent'], '{""}', '{reconciliation}', '{NULL}'
			  FROM nextval('operation_timeline_line_seq') AS line`, id)
	}

	var notice string
	first := fmt.Sprintf(`[data-testid="reconcile-%d"] [data-testid="resolve-mark_done"] button`, ids[0])
	err = chromedp.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/reconciliation"),
		chromedp.WaitVisible(first, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	browsertest.Screenshot(ctx, t, "reconciliation-page")
	err = chromedp.Run(ctx,
		chromedp.Click(first, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="notice"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="notice"]`, &notice, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(notice, "decision recorded") {
		t.Errorf("notice %q", notice)
	}
	var opStatus, policyStatus string
	s.DB.Pool.QueryRow(bg, `SELECT o.status, p.status FROM operations o JOIN policies p ON p.id = o.policy_id WHERE o.id = $1`, ids[0]).Scan(&opStatus, &policyStatus)
	if opStatus != "SUCCEEDED" || policyStatus != "CANCELLED" {
		t.Fatalf("after mark cancelled: operation %s, policy %s", opStatus, policyStatus)
	}

	// Another admin decides on the second one while this page shows it.
	s.DB.Pool.Exec(bg, `UPDATE operations SET status = 'FAILED', updated_at = now(), finished_at = now() WHERE id = $1`, ids[1])
	var page string
	err = chromedp.Run(ctx,
		chromedp.Click(fmt.Sprintf(`[data-testid="reconcile-%d"] [data-testid="resolve-retry"] button`, ids[1]), chromedp.ByQuery),
		chromedp.WaitVisible(`article.notice`, chromedp.ByQuery),
		chromedp.Text(`main`, &page, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page, "Someone else already resolved it") {
		t.Errorf("stale decision page: %q", page)
	}
	browsertest.Screenshot(ctx, t, "reconciliation-already-resolved")
}
