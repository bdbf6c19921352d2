package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/fault"
)

// signInAdmin opens the desk as the admin.
func signInAdmin(t *testing.T, ctx context.Context, s *testServer) {
	t.Helper()
	err := browsertest.Run(ctx,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/reconciliation"),
		chromedp.WaitVisible(`[data-testid="desk-counts"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
}

// shootBoth saves what the screen shows at 1280 px and at 390 px (a
// phone), then goes back to 1280. The viewport, not the full page: a desk
// of many cards is a very tall page.
func shootBoth(t *testing.T, ctx context.Context, label string) {
	t.Helper()
	shootBothAt(t, ctx, label, "")
}

// shootBothAt is shootBoth with sel (when not "") scrolled into view at
// each width: a card's buttons far down a page.
func shootBothAt(t *testing.T, ctx context.Context, label, sel string) {
	t.Helper()
	if !browsertest.SavingScreenshots() {
		return
	}
	for _, size := range [][2]int64{{1280, 1000}, {390, 1400}} {
		var png []byte
		actions := []chromedp.Action{chromedp.EmulateViewport(size[0], size[1])}
		if sel != "" {
			actions = append(actions, chromedp.ScrollIntoView(sel, chromedp.ByQuery))
		}
		err := browsertest.Run(ctx, append(actions, chromedp.CaptureScreenshot(&png))...)
		if err != nil {
			t.Fatal(err)
		}
		dir := browsertest.ScreenshotDir()
		os.MkdirAll(dir, 0o755)
		name := strings.NewReplacer("/", "_").Replace(fmt.Sprintf("%s-%s-%d.png", t.Name(), label, size[0]))
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := browsertest.Run(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
}

func attr(t *testing.T, ctx context.Context, sel, name string) string {
	t.Helper()
	var v string
	var ok bool
	if err := browsertest.Run(ctx, chromedp.AttributeValue(sel, name, &v, &ok, chromedp.ByQuery)); err != nil {
		t.Fatalf("%s[%s]: %v", sel, name, err)
	}
	return v
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	var v string
	if err := browsertest.Run(ctx, chromedp.Text(sel, &v, chromedp.ByQuery)); err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// One item whose provider truth is COMPLETED and one whose truth is
// NOT_STARTED with every deadline passed: the first suggests mark
// cancelled, the second retry, with mark cancelled disabled and the reason
// shown. A note over the limit is refused with the field named; a decision
// without a note is taken. The evidence page has every call and answer, the
// ledger and the timeline; the customer's page says a person must decide.
func TestBrowserReconciliationSuggestionFollowsTheTruth(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	outage(t, s, 2, 2)
	heal(t, s)
	ctx := browsertest.New(t)
	signInAdmin(t, ctx, s)

	// Before asking: nobody knows; ask again is the first action.
	if n := attr(t, ctx, `[data-testid="count-UNKNOWN"]`, "data-n"); n != "4" {
		t.Fatalf("unknown before asking: %s", n)
	}
	if n := attr(t, ctx, `[data-testid="reconcile-badge"]`, "data-n"); n != "4" {
		t.Errorf("nav badge: %s", n)
	}
	askAllUntilAnswered(t, ctx, 4)
	ledger := s.ledger(t)
	var completed, notStarted int64
	rows, err := s.DB.Pool.Query(context.Background(), `SELECT id, policy_id FROM operations ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, policy int64
		rows.Scan(&id, &policy)
		if ledger[policy] == 1 {
			completed = id
		} else {
			notStarted = id
		}
	}
	if completed == 0 || notStarted == 0 {
		t.Fatalf("want one of each: ledger %v", ledger)
	}
	card := func(id int64) string { return fmt.Sprintf(`[data-testid="reconcile-%d"]`, id) }

	// COMPLETED → mark cancelled first.
	if got := attr(t, ctx, card(completed), "data-truth"); got != "COMPLETED" {
		t.Fatalf("truth of %d: %s", completed, got)
	}
	if got := attr(t, ctx, card(completed), "data-suggested"); got != "mark_done" {
		t.Errorf("COMPLETED suggests %q", got)
	}
	if s := text(t, ctx, card(completed)+` [data-testid="suggestion"]`); !strings.Contains(s, "took effect") {
		t.Errorf("COMPLETED suggestion: %q", s)
	}
	if l := text(t, ctx, card(completed)+` [data-testid="resolve-mark_done"] button`); l != "Provider confirms: mark cancelled" {
		t.Errorf("COMPLETED first button: %q", l)
	}
	// NOT_STARTED → retry first; mark cancelled disabled, and why.
	if got := attr(t, ctx, card(notStarted), "data-suggested"); got != "retry" {
		t.Errorf("NOT_STARTED suggests %q", got)
	}
	var disabled bool
	if err := browsertest.Run(ctx, chromedp.Evaluate(fmt.Sprintf(
		`document.querySelector('%s [data-testid="resolve-mark_done"] button').disabled`, card(notStarted)), &disabled)); err != nil {
		t.Fatal(err)
	}
	if !disabled {
		t.Errorf("mark cancelled enabled on NOT_STARTED")
	}
	if why := text(t, ctx, card(notStarted)+` [data-testid="resolve-mark_done"] [data-testid="disabled-reason"]`); !strings.Contains(why, "no record of the call") {
		t.Errorf("why mark cancelled is disabled: %q", why)
	}
	// The card never says what no answer can prove.
	if all := text(t, ctx, `main`); strings.Contains(all, "never saw") {
		t.Errorf("the desk claims the provider never saw a call: %q", all)
	}
	shootBoth(t, ctx, "desk-after-asking")

	// The customer's page of a waiting item: a person must confirm.
	err = browsertest.Run(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/operations/%d", s.URL, completed)),
		chromedp.WaitVisible(`[data-testid="waiting-for-person"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if p := text(t, ctx, `[data-testid="operation-panel"] hgroup`); !strings.Contains(p, "Waiting for a person to confirm with the provider") || strings.Contains(p, "Finished") {
		t.Errorf("operation page: %q", p)
	}

	// The evidence, in one place.
	err = browsertest.Run(ctx,
		chromedp.Navigate(fmt.Sprintf("%s/reconciliation/items/%d", s.URL, completed)),
		chromedp.WaitVisible(`[data-testid="evidence-calls"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	calls := text(t, ctx, `[data-testid="evidence-calls"]`)
	if !strings.Contains(calls, "call") || !strings.Contains(calls, "nothing came back") || !strings.Contains(calls, "COMPLETED") {
		t.Errorf("evidence calls: %q", calls)
	}
	if l := text(t, ctx, `[data-testid="evidence-ledger"]`); !strings.Contains(l, "1 effects applied") {
		t.Errorf("ledger: %q", l)
	}
	if tl := text(t, ctx, `[data-testid="timeline"]`); !strings.Contains(tl, "NEEDS_RECONCILIATION") {
		t.Errorf("timeline: %q", tl)
	}
	shootBoth(t, ctx, "evidence")

	// A note over the limit: refused, the field named, nothing decided.
	err = browsertest.Run(ctx,
		chromedp.SetValue(card(completed)+` [data-testid="note-mark_done"]`, strings.Repeat("x", 501), chromedp.ByQuery),
		chromedp.Click(`[data-testid="resolve-mark_done"] button`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	waitText(t, ctx, "main", "note must be at most 500 bytes")
	var status string
	s.DB.Pool.QueryRow(context.Background(), `SELECT status FROM operations WHERE id = $1`, completed).Scan(&status)
	if status != "NEEDS_RECONCILIATION" {
		t.Fatalf("after a refused note: %s", status)
	}
	browsertest.Screenshot(ctx, t, "note-too-long")
	// Without a note: decided, and in the audit trail.
	err = browsertest.Run(ctx,
		chromedp.Navigate(s.URL+"/reconciliation"),
		chromedp.Click(card(completed)+` [data-testid="resolve-mark_done"] button`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="decisions"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := text(t, ctx, `[data-testid="notice"]`); !strings.Contains(n, "decision recorded") {
		t.Errorf("notice: %q", n)
	}
	if d := text(t, ctx, `[data-testid="decisions"]`); !strings.Contains(d, "marked done") || !strings.Contains(d, "COMPLETED") {
		t.Errorf("decisions list: %q", d)
	}
}

// askAllUntilAnswered clicks "ask again for all shown" until every one of
// n items got an answer (on a loaded machine a status query can outlive
// its timeout), as a person would; it returns the clicks.
// submitForNotice clicks the button sel and returns the notice of the page
// its form leads to. The notice already on the page (an earlier answer) is
// removed first: otherwise the wait could match it at once, and the read
// after it land while the new page replaces it ("Cannot find context with
// specified id", seen once the screenshots no longer slowed the steps).
func submitForNotice(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	err := browsertest.Run(ctx,
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="notice"]').forEach(n => n.remove())`, nil),
		chromedp.Click(sel, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="notice"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	return text(t, ctx, `[data-testid="notice"]`)
}

func askAllUntilAnswered(t *testing.T, ctx context.Context, n int) int {
	t.Helper()
	for try := 1; ; try++ {
		notice := submitForNotice(t, ctx, `[data-testid="ask-all"] button`)
		if strings.Contains(notice, fmt.Sprintf("%d of %d answered", n, n)) {
			return try
		}
		if try == 5 {
			t.Fatalf("after %d clicks: %q", try, notice)
		}
	}
}

func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got string
		browsertest.Run(ctx, chromedp.Text(sel, &got, chromedp.ByQuery))
		if strings.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never said %q: %q", sel, want, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A desk of 40 items left by an outage, cleared in four clicks (the API
// test does the same with 200, through the requests these buttons send): ask again
// while the provider still cannot be asked (nothing is learned, nothing
// decided), ask again once it is healed (every truth is conclusive), then
// one bulk button per decision. Every policy is cancelled once at the
// provider and every invariant holds.
func TestBrowserBulkAskAgainClearsAnOutage(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	policies := outage(t, s, 20, 20)
	ctx := browsertest.New(t)
	signInAdmin(t, ctx, s)
	if n := text(t, ctx, `[data-testid="desk-total"]`); n != "40" {
		t.Fatalf("desk total %s", n)
	}
	// Asked during the outage: no answer, no bulk decision offered.
	if n := submitForNotice(t, ctx, `[data-testid="ask-all"] button`); !strings.Contains(n, "0 of 40 answered") {
		t.Fatalf("asked during the outage: %q", n)
	}
	var bulk int
	browsertest.Run(ctx, chromedp.Evaluate(`document.querySelectorAll('[data-testid^="bulk-"]').length`, &bulk))
	if bulk != 0 {
		t.Fatalf("%d bulk decisions offered on unknown truths", bulk)
	}
	shootBoth(t, ctx, "desk-during-outage")

	heal(t, s)
	clicks := 1 + askAllUntilAnswered(t, ctx, 40)
	ledger := s.ledger(t)
	applied := 0
	for _, id := range policies {
		applied += int(ledger[id])
	}
	if got := attr(t, ctx, `[data-testid="count-COMPLETED"]`, "data-n"); got != fmt.Sprint(applied) {
		t.Fatalf("COMPLETED %s, the ledger has %d", got, applied)
	}
	if got := attr(t, ctx, `[data-testid="count-NOT_STARTED"]`, "data-n"); got != fmt.Sprint(40-applied) {
		t.Fatalf("NOT_STARTED %s, want %d", got, 40-applied)
	}
	shootBoth(t, ctx, "desk-healed")
	for _, action := range []string{"mark_done", "retry"} {
		if action == "mark_done" && applied == 0 || action == "retry" && applied == 40 {
			continue // the outage left none of these
		}
		clicks++
		if n := submitForNotice(t, ctx, fmt.Sprintf(`[data-testid="bulk-%s"] button`, action)); !strings.Contains(n, " decided.") || strings.Contains(n, "changed") {
			t.Fatalf("after bulk %s: %q", action, n)
		}
	}
	waitAllSucceeded(t, s, 40)
	ledger = s.ledger(t)
	for _, id := range policies {
		if ledger[id] != 1 {
			t.Errorf("policy %d: %d effects", id, ledger[id])
		}
	}
	s.assertInvariants(t)
	err := browsertest.Run(ctx,
		chromedp.Navigate(s.URL+"/reconciliation"),
		chromedp.WaitVisible(`[data-testid="nothing-to-reconcile"]`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := attr(t, ctx, `[data-testid="reconcile-badge"]`, "data-n"); n != "0" {
		t.Errorf("badge after clearing: %s", n)
	}
	shootBoth(t, ctx, "desk-cleared")
	t.Logf("40 items cleared in %d clicks (%d applied by the provider, %d never received)", clicks, applied, 40-applied)
}

var hiddenInput = regexp.MustCompile(`name="(idempotency_key|item|action|_csrf|return)" value="([^"]*)"`)

// Two admins decide the same items at once — one in the browser, one from
// another session posting the same bulk form — and one wins per item: every
// item has exactly one decision, and the loser is told.
func TestBrowserTwoAdminsDecideTheSameItemsAtOnce(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	outage(t, s, 3, 3)
	heal(t, s)
	s.askUntilAllAnswer(t, 6)
	ctx := browsertest.New(t)
	signInAdmin(t, ctx, s)

	// The other admin opens the same desk in their own session.
	jar, _ := cookiejar.New(nil)
	other := noRedirectClient(jar)
	s.signIn(t, other, "admin")
	page := doWith(t, other, s.URL, request{Method: "GET", Path: "/reconciliation"})
	form := bulkForm(t, string(page.Body), "mark_done")

	var wg sync.WaitGroup
	var theirs response
	start := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		theirs = doWith(t, other, s.URL, request{Method: "POST", Path: "/reconciliation/decide", Body: form.Encode(),
			Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	}()
	close(start)
	err := browsertest.Run(ctx,
		chromedp.Click(`[data-testid="bulk-mark_done"] button`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="notice"]`, chromedp.ByQuery),
	)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	mine := text(t, ctx, `[data-testid="notice"]`)
	if theirs.Status != http.StatusSeeOther {
		t.Fatalf("the other admin: %d %s", theirs.Status, theirs.Body)
	}
	q, _ := url.ParseQuery(strings.SplitN(theirs.Header.Get("Location"), "?", 2)[1])
	n := len(form["item"])
	var myDecided int
	fmt.Sscanf(mine, "%d decided.", &myDecided)
	theirDecided, theirChanged := q.Get("decided"), q.Get("changed")
	if fmt.Sprint(n-myDecided) != theirDecided || theirChanged != fmt.Sprint(myDecided) {
		t.Errorf("%d items: I decided %d (%q); they decided %s, %s had changed", n, myDecided, mine, theirDecided, theirChanged)
	}
	if myDecided != n && !strings.Contains(mine, "had changed since shown") {
		t.Errorf("the loser is not told: %q", mine)
	}
	var items, decisions, most int
	s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(DISTINCT operation_id), count(*), coalesce(max(n), 0)
		  FROM (SELECT operation_id, count(*) OVER (PARTITION BY operation_id) n FROM reconciliation_decisions) d`).Scan(&items, &decisions, &most)
	if items != n || decisions != n || most != 1 {
		t.Errorf("%d items decided, %d decisions, at most %d per item; want %d, %d, 1", items, decisions, most, n, n)
	}
	browsertest.Screenshot(ctx, t, "two-admins")
}

// bulkForm reads the desk's bulk form for action from a page.
func bulkForm(t *testing.T, page, action string) url.Values {
	t.Helper()
	start := strings.Index(page, `data-testid="bulk-`+action+`"`)
	if start < 0 {
		t.Fatalf("no bulk %s form on the page", action)
	}
	end := strings.Index(page[start:], "</form>")
	v := url.Values{}
	for _, m := range hiddenInput.FindAllStringSubmatch(page[start:start+end], -1) {
		v.Add(m[1], strings.ReplaceAll(m[2], "&amp;", "&"))
	}
	// the CSRF field comes first in the form, before the testid attribute
	if m := csrfInput.FindStringSubmatch(page); m != nil {
		v.Set("_csrf", m[1])
	}
	return v
}

// The desk says what handing back does, on the belief, and what recovery
// settled before the person asked (issue 29, findings 8, 16): a provider
// not believed idempotent, its status queries failing, one cancellation on
// the desk — "Hand back to recovery" says it sends nothing until the
// provider answers. Healed, recovery's own re-ask settles it while the page
// is still open; the person's "Ask again" then asks nothing, and the notice
// says recovery settled it before they asked. Screenshots at 1280 and
// 390 px of the card and of the notice.
func TestBrowserDeskSaysWhatRecoveryDoesAndDid(t *testing.T) {
	t.Parallel()
	s := startServer(t, outageEnv)
	outage(t, s, 1, 0)
	ctx := browsertest.New(t)
	signInAdmin(t, ctx, s)
	caution := text(t, ctx, `[data-testid="resolve-retry"] [data-testid="caution"]`)
	if !strings.Contains(caution, "not believed idempotent") || !strings.Contains(caution, "sends nothing until provider answers") {
		t.Errorf("the hand-back's caution: %q", caution)
	}
	if label := text(t, ctx, `[data-testid="resolve-retry"] button`); label != "Hand back to recovery" {
		t.Errorf("the button says %q", label)
	}
	// The card's buttons, with what each says under it, in sight.
	shootBothAt(t, ctx, "card", `[data-testid="resolve-mark_failed"]`)

	heal(t, s)
	bg := context.Background()
	var id int64
	if err := s.DB.Pool.QueryRow(bg, `
		UPDATE operations
		   SET next_attempt_at = now() -- recovery's re-ask is due: it asks before the person does
		 WHERE status = 'NEEDS_RECONCILIATION'
		RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() bool {
		var status string
		s.DB.Pool.QueryRow(bg, `SELECT status FROM operations WHERE id = $1`, id).Scan(&status)
		return status == "SUCCEEDED"
	})
	var notice string
	err := browsertest.Run(ctx,
		chromedp.Click(`[data-testid="ask-again"] button`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="notice"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="notice"]`, &notice, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Nothing was asked again", "recovery settled 1 on its own", "before you asked", "None of them waits"} {
		if !strings.Contains(notice, want) {
			t.Errorf("the notice %q does not say %q", notice, want)
		}
	}
	shootBoth(t, ctx, "notice")
}

// A refund payments refused definitely stays REJECTED on the desk when
// payments then cannot be asked (issue 29, finding 6): pressing "Ask
// payments again" while its status queries fail leaves the card's truth and
// its count under REJECTED — not "no answer" — and the card says the
// question went unanswered and that no answer undoes no refusal.
// Screenshots at 1280 and 390 px.
func TestBrowserARefusedRefundStaysRefusedWhenPaymentsCannotBeAsked(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PAYMENTS_TIMEOUT": "2s"})
	s.paymentsMode(t, fault.ModeReject)
	var op operationJSON
	s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "refused-then-unanswered", "")).JSON(t, &op)
	if r := s.do(request{Method: "PUT", Path: "/api/v1/payments/faults", Token: "demo-admin",
		Body: `{"mode":"reject","status_mode":"error"}`}); r.Status != http.StatusOK {
		t.Fatalf("payments faults: %d %s", r.Status, r.Body)
	}
	ctx := browsertest.New(t)
	signInAdmin(t, ctx, s)
	card := fmt.Sprintf(`[data-testid="reconcile-%d"]`, op.ID)
	var now string
	err := browsertest.Run(ctx,
		chromedp.Click(card+` [data-testid="ask-again"] button`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="notice"]`, chromedp.ByQuery),
		chromedp.Text(card+` [data-testid="live-truth"]`, &now, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := attr(t, ctx, card, "data-truth"); got != "REJECTED" {
		t.Errorf("the card's truth now is %s after an unanswered question, want REJECTED", got)
	}
	if n := attr(t, ctx, `[data-testid="count-REJECTED"]`, "data-n"); n != "1" {
		t.Errorf("REJECTED counts %s, want 1", n)
	}
	if n := attr(t, ctx, `[data-testid="count-UNKNOWN"]`, "data-n"); n != "0" {
		t.Errorf("no answer counts %s, want 0", n)
	}
	if !strings.HasPrefix(now, "REJECTED:") || !strings.Contains(now, "no answer does not undo a refusal") {
		t.Errorf("truth now reads %q", now)
	}
	shootBothAt(t, ctx, "card", card+` [data-testid="live-truth"]`)
}
