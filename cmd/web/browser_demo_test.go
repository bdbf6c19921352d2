package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/demo"
)

// Issue 17, part B: a walk-through as an admin in demo mode meets a header
// that names them once (defect 10), a 404 that still knows who is signed in
// and an icon that is not a 404 (7), a red banner while an invariant is
// broken (1), the other accounts one click away on every page, and a reset
// of the demo data from the page (9).
func TestBrowserDemoWalkThrough(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	ctx := context.Background()
	// Break invariant 1 behind the app's back: two effects for one policy.
	if _, err := s.DB.Pool.Exec(ctx, `
		INSERT INTO fake_provider.effects (idempotency_key, policy_id, applied_at)
		VALUES ('walk-1', 3, now()), ('walk-2', 3, now())`); err != nil {
		t.Fatal(err)
	}
	b := browsertest.New(t)

	var who, banner string
	var signInLinks int
	err := chromedp.Run(b,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-bar"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		chromedp.Text(`[data-testid="invariant-banner"]`, &banner, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(who) != "admin" {
		t.Errorf("the header names the admin as %q, want \"admin\" once", who)
	}
	if !strings.Contains(banner, "Invariant 1") || !strings.Contains(banner, "3") {
		t.Errorf("banner %q does not name invariant 1 and policy 3", banner)
	}
	shoot(t, b, "home-broken")

	// A page that does not exist, signed in: the header is the signed-in one.
	var iconStatus int64
	var iconLink bool
	err = chromedp.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/no-such-page"),
		chromedp.WaitVisible(`[data-testid="error-message"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('header a[href="/signin"]').length`, &signInLinks),
		chromedp.Evaluate(`!!document.querySelector('link[rel="icon"][href="/favicon.ico"]')`, &iconLink),
		chromedp.Evaluate(`fetch('/favicon.ico').then(r => r.status)`, &iconStatus, awaitPromise),
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(who) != "admin" || signInLinks != 0 {
		t.Errorf("the 404 page shows %q and %d Sign in links to a signed-in admin", who, signInLinks)
	}
	if iconStatus != http.StatusOK || !iconLink {
		t.Errorf("favicon: /favicon.ico answers %d, <link rel=icon> present %v", iconStatus, iconLink)
	}
	shoot(t, b, "not-found")

	// Switch to alice from the bar on the slots page: one click, the same
	// page, a new session — admin's is gone from the server.
	var path string
	var aliceBanner int
	err = chromedp.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Navigate(s.URL+"/slots"),
		chromedp.Click(`[data-testid="switch-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="switch-admin"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		chromedp.Evaluate(`location.pathname`, &path),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="invariant-banner"]').length`, &aliceBanner),
	)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(who) != "alice" || path != "/slots" {
		t.Errorf("after switching: signed in as %q on %s, want alice on /slots", who, path)
	}
	if aliceBanner != 0 {
		t.Errorf("a customer sees the invariants banner")
	}
	sessions := sessionsByUser(t, s)
	if sessions["admin"] != 0 || sessions["alice"] != 1 {
		t.Errorf("sessions after the switch: %v, want alice's only", sessions)
	}

	// Alice's policies: the bigger dataset.
	var rows int
	err = chromedp.Run(b,
		chromedp.Navigate(s.URL+"/policies"),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="policies"] tbody tr').length`, &rows),
	)
	if err != nil {
		t.Fatal(err)
	}
	if rows != demo.PoliciesPerCustomer || rows < 20 {
		t.Errorf("alice has %d policies on the page, want %d", rows, demo.PoliciesPerCustomer)
	}
	// Something to undo: one of alice's policies cancelled behind the app's back.
	if _, err := s.DB.Pool.Exec(ctx, `UPDATE policies SET status = 'CANCELLED' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}

	// An armed crash point, which the reset must disarm with the rest
	// (reader's finding 5: it stayed armed and cut off the next request).
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin", Body: `{"at": "after_commit", "mode": "abandon"}`}); r.Status != http.StatusOK {
		t.Fatalf("arming a crash point: %d %s", r.Status, r.Body)
	}
	// And the redelivery injector, which the reset disarms too (issue 29,
	// finding 21: the notice said "both fakes at their defaults" and left it
	// armed).
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/events/injector", Token: "demo-admin", Body: `{"mode": "deliver_twice", "count": 5}`}); r.Status != http.StatusOK {
		t.Fatalf("arming the redelivery injector: %d %s", r.Status, r.Body)
	}

	// Back to admin, and reset from the demo page, confirmed.
	var done string
	var armedBefore, armedAfter int
	err = chromedp.Run(b,
		chromedp.Click(`[data-testid="switch-admin"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="demo-controls"]`, chromedp.ByQuery),
		chromedp.Click(`[data-testid="demo-controls"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="reset-form"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="crash-armed"]').length`, &armedBefore),
	)
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, b, "demo-controls")
	err = chromedp.Run(b,
		chromedp.EmulateViewport(1280, 900),
		chromedp.Click(`[data-testid="reset-confirm"]`, chromedp.ByQuery),
		chromedp.Click(`[data-testid="reset-submit"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="reset-done"]`, chromedp.ByQuery),
		chromedp.Text(`[data-testid="reset-done"]`, &done, chromedp.ByQuery),
		chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="invariant-banner"]').length`, &rows),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="crash-armed"]').length`, &armedAfter),
	)
	if err != nil {
		t.Fatal(err)
	}
	if armedBefore != 1 || armedAfter != 0 || !strings.Contains(done, "the crash point and the Events page's redelivery injector disarmed") {
		t.Errorf("crash point shown armed %d times before the reset, %d after; the notice says %q", armedBefore, armedAfter, done)
	}
	var set struct{ At string }
	s.do(request{Method: "GET", Path: "/api/v1/admin/crash", Token: "demo-admin"}).JSON(t, &set)
	if set.At != "" {
		t.Errorf("after the reset the crash point %q is still armed", set.At)
	}
	if strings.TrimSpace(who) != "admin" || !strings.Contains(done, "60 active policies") {
		t.Errorf("after the reset: signed in as %q, message %q", who, done)
	}
	if rows != 0 {
		t.Errorf("the banner is still shown after a reset that removed the violation")
	}
	var active, effects int
	s.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM policies WHERE status = 'ACTIVE'), (SELECT count(*) FROM fake_provider.effects)`).Scan(&active, &effects)
	if active != 3*demo.PoliciesPerCustomer || effects != 0 {
		t.Errorf("after the reset: %d active policies, %d effects", active, effects)
	}
	shoot(t, b, "reset-done")
	var injections int
	err = chromedp.Run(b,
		chromedp.Navigate(s.URL+"/events"),
		chromedp.WaitVisible(`[data-testid="injector-form"]`, chromedp.ByQuery),
		chromedp.Evaluate(`document.querySelectorAll('[data-testid="injector-script"] li').length`, &injections),
	)
	if err != nil || injections != 0 {
		t.Errorf("after the reset the Events page shows %d redelivery injector entries armed (%v)", injections, err)
	}
}

// awaitPromise makes chromedp.Evaluate wait for a promise's value.
func awaitPromise(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }

// sessionsByUser counts the live sessions of each user.
func sessionsByUser(t *testing.T, s *testServer) map[string]int {
	t.Helper()
	rows, err := s.DB.Pool.Query(context.Background(), `
		SELECT u.name, count(*) FROM sessions JOIN users u ON u.id = sessions.user_id GROUP BY u.name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		rows.Scan(&name, &n)
		out[name] = n
	}
	return out
}

// Every page of the walk-through says what it shows and what to try, and
// fits a 390 px phone (cards stack, tables scroll inside their box) —
// defect 11 and "mobile" of issue 17, part B. Screenshots at 1280 and 390.
func TestBrowserEveryPageSaysWhatToTryAndFitsAPhone(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	// An operation to open: alice cancels her first policy over the API.
	cancelled := s.do(cancelReq(1, "demo-alice", "intro-page-cancel", `{"reason":"walk-through"}`))
	var op struct {
		ID int64 `json:"id"`
	}
	cancelled.JSON(t, &op)
	if cancelled.Status != 200 || op.ID == 0 {
		t.Fatalf("cancel policy 1: %d %s", cancelled.Status, cancelled.Body)
	}
	operation := fmt.Sprintf("/operations/%d", op.ID)
	b := browsertest.New(t)
	var lab string
	err := chromedp.Run(b,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-alice"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/labs"),
		chromedp.AttributeValue(`ol.labs a[href^="/labs/"]:not([href="/labs/race"])`, "href", &lab, nil, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	pages := []struct {
		path  string
		intro bool
	}{
		{"/policies", true}, {"/slots", true}, {"/labs", true}, {"/labs/race", true}, {lab, true},
		{"/recovery", true}, {"/events", true}, {"/operations", true}, {operation, true}, {"/", false},
	}
	for _, as := range []string{"alice", "admin"} {
		if as == "admin" {
			pages = []struct {
				path  string
				intro bool
			}{{"/provider", true}, {"/payments", true}, {"/recovery", true}, {"/operations", true}, {"/reconciliation", true}, {"/events", true},
				{operation, true}, {"/admin/demo", true}, {"/no-such-page", false}}
			if err := chromedp.Run(b, chromedp.EmulateViewport(1280, 900),
				chromedp.Click(`[data-testid="switch-admin"]`, chromedp.ByQuery),
				chromedp.WaitVisible(`[data-testid="demo-controls"]`, chromedp.ByQuery)); err != nil {
				t.Fatal(err)
			}
		}
		for _, pg := range pages {
			var intro string
			var n int
			err := chromedp.Run(b,
				chromedp.EmulateViewport(1280, 900),
				chromedp.Navigate(s.URL+pg.path),
				chromedp.WaitVisible(`main`, chromedp.ByQuery),
				chromedp.Evaluate(`document.querySelectorAll('[data-testid="page-intro"]').length`, &n),
			)
			if err != nil {
				t.Fatalf("%s: %v", pg.path, err)
			}
			if pg.intro {
				if n != 1 {
					t.Errorf("%s has %d intros, want 1", pg.path, n)
					continue
				}
				chromedp.Run(b, chromedp.Text(`[data-testid="page-intro"]`, &intro, chromedp.ByQuery))
				if !strings.Contains(intro, "What you are looking at") || !strings.Contains(intro, "Try this") {
					t.Errorf("%s intro: %q", pg.path, intro)
				}
			}
			shoot(t, b, as+strings.ReplaceAll(pg.path, "/", "-"))
		}
	}
}

// Defects 11 and 15: booking a slot does not shift the grid's columns; slot
// times say their zone; a slot that has begun is shown as past and refused
// — 409 slot-in-past over the API, a notice on the page for a form rendered
// before it began.
func TestBrowserSlotGridStaysPutAndThePastIsNotForSale(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"})
	ctx := context.Background()
	bob := s.browserClient()
	s.signIn(t, bob, "bob")
	past, free := freeSlot(t, s.DB, 0), freeSlot(t, s.DB, 1)
	book := fmt.Sprintf("/slots/%d/book", past)
	form := formFields(t, doWith(t, bob, s.URL, request{Method: "GET", Path: "/slots"}).Body, book)
	// The slot begins (an hour ago) while bob's page is open.
	if _, err := s.DB.Pool.Exec(ctx, `
		UPDATE slots SET starts_at = date_trunc('hour', now()) - interval '1 hour',
		                 ends_at = date_trunc('hour', now()) WHERE id = $1`, past); err != nil {
		t.Fatal(err)
	}
	r := postForm(t, s, bob, book, form)
	if r.Status != http.StatusSeeOther || !strings.Contains(r.Header.Get("Location"), "notice=slot-in-past") {
		t.Fatalf("booking a slot that has begun, from the grid: %d %s", r.Status, r.Header.Get("Location"))
	}
	if page := doWith(t, bob, s.URL, request{Method: "GET", Path: r.Header.Get("Location")}); !bytes.Contains(page.Body, []byte("has already begun")) {
		t.Fatalf("the grid's notice does not say the slot has begun:\n%s", page.Body)
	}
	if r := s.book("demo-alice", past, newKey(), ""); r.Status != http.StatusConflict || r.problemType() != "slot-in-past" {
		t.Fatalf("API booking of a slot that has begun: %d %s", r.Status, r.Body)
	}
	var n int
	s.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM bookings WHERE slot_id = $1`, past).Scan(&n)
	if n != 0 {
		t.Fatalf("%d bookings of a slot that has begun", n)
	}

	b := browsertest.New(t)
	cell := fmt.Sprintf(`[data-slot-id="%d"]`, free)
	widths := `[...document.querySelector('[data-testid="slot-grid"] thead tr').children].map(th => th.getBoundingClientRect().width.toFixed(1)).join(' ')`
	var before, after, zone, state, title string
	err := chromedp.Run(b,
		chromedp.Navigate(s.URL+"/signin"),
		chromedp.Click(`[data-testid="signin-carol"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`[data-testid="policies"]`, chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/slots"),
		chromedp.WaitVisible(cell+`[data-state="free"]`, chromedp.ByQuery),
		chromedp.Evaluate(widths, &before),
		chromedp.Text(`[data-testid="slot-zone"]`, &zone, chromedp.ByQuery),
		chromedp.AttributeValue(fmt.Sprintf(`[data-slot-id="%d"]`, past), "data-state", &state, nil, chromedp.ByQuery),
		chromedp.AttributeValue(cell, "title", &title, nil, chromedp.ByQuery),
		chromedp.Click(cell, chromedp.ByQuery),
		chromedp.WaitVisible(cell+`[data-state="mine"]`, chromedp.ByQuery),
		chromedp.Evaluate(widths, &after),
	)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("booking a slot shifted the grid's columns: %s → %s", before, after)
	}
	if zone != "UTC" || !strings.HasSuffix(title, " UTC") {
		t.Errorf("slot times without their zone: %q, title %q", zone, title)
	}
	if state != "past" {
		t.Errorf("the slot that has begun is shown %q, want past", state)
	}
	shoot(t, b, "slots-booked")
}
