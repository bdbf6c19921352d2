package main

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/idemlab/idemlab/internal/testdb"
)

// Defect 14 of issue 17: without SESSION_SECRET, restarting the app (the
// crash demo) signed everyone out of their forms — each process made a
// random secret, so the CSRF token of every page rendered before the
// restart was refused. The secret is now kept in the database: a new
// process on the same database (a restart, or a second replica) accepts
// the session and the token of a page the old one rendered.
func TestARestartKeepsTheSessionAndItsForms(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	unset := map[string]string{"SESSION_SECRET": "", "EVENTS_WORKERS": "off"}
	before := startServerOn(t, db, unset)
	client := before.browserClient()
	before.signIn(t, client, "alice")
	page := doWith(t, client, before.URL, request{Method: "GET", Path: "/policies"})
	token := csrfInput.FindSubmatch(page.Body)
	if page.Status != http.StatusOK || token == nil {
		t.Fatalf("policies before the restart: %d, CSRF field found %v", page.Status, token != nil)
	}
	cookie := sessionCookieOf(t, before, client)

	after := startServerOn(t, db, unset) // a new process: what a restart starts
	if r := withCookies(t, after.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": cookie}); r.Status != http.StatusOK {
		t.Fatalf("the session after the restart: %d, want 200 (still signed in)", r.Status)
	}
	// The sign-out form of the page rendered before the restart still works.
	form := url.Values{"_csrf": {string(token[1])}}
	r := withCookies(t, after.URL, request{Method: "POST", Path: "/signout", Body: form.Encode(),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, map[string]string{"idemlab_session": cookie})
	if r.Status != http.StatusSeeOther {
		t.Fatalf("a form rendered before the restart, posted after it: %d %s, want 303", r.Status, r.Body)
	}

	// SESSION_SECRET still wins: a page of a process given one carries a
	// token the database's secret does not make.
	own := startServerOn(t, db, map[string]string{"SESSION_SECRET": "an-explicit-secret", "EVENTS_WORKERS": "off"})
	client = own.browserClient()
	own.signIn(t, client, "bob")
	ownToken := csrfInput.FindSubmatch(doWith(t, client, own.URL, request{Method: "GET", Path: "/policies"}).Body)
	form = url.Values{"_csrf": {string(ownToken[1])}}
	if r := withCookies(t, after.URL, request{Method: "POST", Path: "/signout", Body: form.Encode(),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, map[string]string{"idemlab_session": sessionCookieOf(t, own, client)}); r.Status != http.StatusForbidden {
		t.Fatalf("the stored secret accepted a token made under SESSION_SECRET: %d", r.Status)
	}
}
