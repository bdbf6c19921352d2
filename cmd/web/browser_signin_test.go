package main

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemlab/idemlab/internal/browsertest"
	"github.com/idemlab/idemlab/internal/testdb"
)

// Outside demo mode a person signs in with a name and a password, on a
// phone as on a desktop: a wrong password says so and keeps the name, the
// right one signs in.
func TestBrowserSignInWithAPassword(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	if out, err := runCommand(t, map[string]string{"DATABASE_URL": db.URL, "PASSWORD": "correct horse battery"}, "user", "set", "alice"); err != nil {
		t.Fatalf("web user set: %v\n%s", err, out)
	}
	s := startServerOn(t, db, map[string]string{"DEMO_MODE": "false"})
	for _, width := range []int64{1280, 390} {
		ctx := browsertest.New(t)
		var msg, name, who string
		err := chromedp.Run(ctx,
			chromedp.EmulateViewport(width, 900),
			chromedp.Navigate(s.URL+"/signin"),
			chromedp.SendKeys(`[data-testid="signin-name"]`, "alice", chromedp.ByQuery),
			chromedp.SendKeys(`[data-testid="signin-password"]`, "not the password", chromedp.ByQuery),
			chromedp.Click(`[data-testid="signin-submit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`[data-testid="signin-error"]`, chromedp.ByQuery),
			chromedp.Text(`[data-testid="signin-error"]`, &msg, chromedp.ByQuery),
			chromedp.Value(`[data-testid="signin-name"]`, &name, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg, "Wrong name or password") || name != "alice" {
			t.Errorf("%d px: after a wrong password: %q, name %q", width, msg, name)
		}
		browsertest.Screenshot(ctx, t, "wrong-password-"+itoa64(width))
		err = chromedp.Run(ctx,
			chromedp.SendKeys(`[data-testid="signin-password"]`, "correct horse battery", chromedp.ByQuery),
			chromedp.Click(`[data-testid="signin-submit"]`, chromedp.ByQuery),
			chromedp.WaitVisible(`[data-testid="signed-in-as"]`, chromedp.ByQuery),
			chromedp.Text(`[data-testid="signed-in-as"]`, &who, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(who, "alice") {
			t.Errorf("%d px: signed in as %q", width, who)
		}
	}
}
