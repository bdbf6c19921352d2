package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/testdb"
)

// Sessions live on the server: signing out ends one for every replica;
// signing in starts a new one; CSRF tokens are bound to the session.

// sessionCookieOf returns the value of client's session cookie for s.
func sessionCookieOf(t *testing.T, s *testServer, client *http.Client) string {
	t.Helper()
	u, _ := url.Parse(s.URL)
	for _, ck := range client.Jar.Cookies(u) {
		if ck.Name == "idemlab_session" {
			return ck.Value
		}
	}
	t.Fatalf("no session cookie in the jar")
	return ""
}

// withCookies sends req with exactly these cookies, as a replaying attacker would.
func withCookies(t *testing.T, base string, req request, cookies map[string]string) response {
	t.Helper()
	var parts []string
	for k, v := range cookies {
		parts = append(parts, k+"="+v)
	}
	if req.Header == nil {
		req.Header = map[string]string{}
	}
	req.Header["Cookie"] = strings.Join(parts, "; ")
	return doWith(t, noRedirectClient(nil), base, req)
}

func TestSignOutEndsTheSessionOnEveryReplica(t *testing.T) {
	t.Parallel()
	quiet := map[string]string{"EVENTS_WORKERS": "off"} // snapshots: nothing writes behind them
	a := startServer(t, quiet)
	b := startServerOn(t, a.DB, quiet) // a second replica, same database and secret
	client := a.browserClient()
	a.signIn(t, client, "alice")
	stolen := sessionCookieOf(t, a, client)
	if r := withCookies(t, b.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": stolen}); r.Status != 200 {
		t.Fatalf("the other replica does not know the session before sign-out: %d", r.Status)
	}
	// Sign out on replica a (the form carries its CSRF token).
	page := doWith(t, client, a.URL, request{Method: "GET", Path: "/policies"})
	m := csrfInput.FindSubmatch(page.Body)
	if m == nil {
		t.Fatalf("no CSRF field on /policies")
	}
	csrf := string(m[1])
	if r := postForm(t, a, client, "/signout", url.Values{"_csrf": {csrf}}); r.Status != http.StatusSeeOther {
		t.Fatalf("sign out: %d %s", r.Status, r.Body)
	}
	before := snapshotDB(t, a.DB.Pool)
	// The replayed cookie is dead on both replicas: pages send it to sign
	// in, forms are refused, and nothing changes.
	for _, s := range []*testServer{a, b} {
		if r := withCookies(t, s.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": stolen}); r.Status != http.StatusSeeOther || r.Header.Get("Location") != "/signin" {
			t.Errorf("%s: the replayed cookie still reads /policies: %d", s.URL, r.Status)
		}
		form := url.Values{"_csrf": {csrf}, "idempotency_key": {"replayed-" + s.URL}, "reason": {"replay"}}
		r := withCookies(t, s.URL, request{Method: "POST", Path: fmt.Sprintf("/policies/%d/cancel", a.policyOf(t, "demo-alice", 0)),
			Body: form.Encode(), Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}},
			map[string]string{"idemlab_session": stolen})
		if r.Status != http.StatusForbidden && !(r.Status == http.StatusSeeOther && r.Header.Get("Location") == "/signin") {
			t.Errorf("%s: a form with the replayed cookie: %d %s", s.URL, r.Status, r.Body)
		}
	}
	if after := snapshotDB(t, a.DB.Pool); !bytes.Equal(before.digest(), after.digest()) {
		t.Fatalf("a replayed cookie changed the database:\n%s", before.diff(after))
	}
	var live int
	a.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&live)
	if live != 0 {
		t.Errorf("%d sessions left after the only one signed out", live)
	}
}

func TestSignInStartsANewSession(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	client := s.browserClient()
	s.signIn(t, client, "alice")
	first := sessionCookieOf(t, s, client)
	s.signIn(t, client, "bob") // the same browser signs in again
	second := sessionCookieOf(t, s, client)
	if first == second {
		t.Fatal("signing in again kept the session id")
	}
	if r := withCookies(t, s.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": first}); r.Status != http.StatusSeeOther {
		t.Errorf("the session before the new sign-in still works: %d", r.Status)
	}
	r := withCookies(t, s.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": second})
	if r.Status != 200 || !bytes.Contains(r.Body, []byte("POL-BOB-001")) {
		t.Errorf("the new session: %d", r.Status)
	}
	// Cookies of any other shape are not sessions (and cost no query).
	for _, v := range []string{"", "1.99999999999.sig", strings.Repeat("A", 43), "../../etc/passwd", "'; DROP TABLE sessions; --"} {
		if r := withCookies(t, s.URL, request{Method: "GET", Path: "/policies"}, map[string]string{"idemlab_session": v}); r.Status != http.StatusSeeOther {
			t.Errorf("cookie %q: %d, want 303 to sign in", v, r.Status)
		}
	}
}

// Alice's browser carrying bob's CSRF cookie and token — an attacker who
// has his own valid pair and plants it — is refused.
func TestCSRFTokenIsBoundToTheSession(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off"}) // snapshots: nothing writes behind them
	alice, bob := s.browserClient(), s.browserClient()
	s.signIn(t, alice, "alice")
	s.signIn(t, bob, "bob")
	bobsPage := doWith(t, bob, s.URL, request{Method: "GET", Path: "/policies"})
	bobsToken := string(csrfInput.FindSubmatch(bobsPage.Body)[1])
	u, _ := url.Parse(s.URL)
	cookies := map[string]string{"idemlab_session": sessionCookieOf(t, s, alice)}
	for _, ck := range bob.Jar.Cookies(u) {
		if ck.Name == "idemlab_csrf" {
			cookies["idemlab_csrf"] = ck.Value
		}
	}
	pid := s.policyOf(t, "demo-alice", 0)
	before := snapshotDB(t, s.DB.Pool)
	for _, token := range []string{bobsToken, "", "forged"} {
		form := url.Values{"_csrf": {token}, "idempotency_key": {"csrf-" + token}, "reason": {"forged"}}
		r := withCookies(t, s.URL, request{Method: "POST", Path: fmt.Sprintf("/policies/%d/cancel", pid), Body: form.Encode(),
			Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}}, cookies)
		if r.Status != http.StatusForbidden {
			t.Errorf("alice's session with token %q: %d, want 403", token, r.Status)
		}
	}
	if after := snapshotDB(t, s.DB.Pool); !bytes.Equal(before.digest(), after.digest()) {
		t.Fatalf("a forged form changed the database:\n%s", before.diff(after))
	}
	// Her own token works.
	alicesPage := doWith(t, alice, s.URL, request{Method: "GET", Path: fmt.Sprintf("/policies/%d", pid)})
	form := url.Values{"_csrf": {string(csrfInput.FindSubmatch(alicesPage.Body)[1])}, "idempotency_key": {"csrf-own"}, "reason": {"mine"}}
	if r := postForm(t, s, alice, fmt.Sprintf("/policies/%d/cancel", pid), form); r.Status != http.StatusSeeOther {
		t.Fatalf("alice's own form: %d %s", r.Status, r.Body)
	}
}

var setCookieName = regexp.MustCompile(`^([^=]+)=`)

// Behind a TLS-terminating proxy named in TRUSTED_PROXIES, X-Forwarded-Proto
// makes the cookies Secure and __Host- and adds HSTS; from anyone else the
// header is ignored.
func TestCookiesAndHSTSBehindATrustedTLSProxy(t *testing.T) {
	t.Parallel()
	trusting := startServer(t, map[string]string{"TRUSTED_PROXIES": "127.0.0.1"})
	other := startServer(t, map[string]string{"TRUSTED_PROXIES": "192.0.2.0/24"})
	get := func(s *testServer) *http.Response {
		req, _ := http.NewRequest("GET", s.URL+"/signin", nil)
		req.Header.Set("X-Forwarded-Proto", "https")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := get(trusting)
	if resp.Header.Get("Strict-Transport-Security") == "" {
		t.Error("no HSTS behind the trusted proxy")
	}
	cks := resp.Header.Values("Set-Cookie")
	if len(cks) == 0 {
		t.Fatal("no cookie set on /signin")
	}
	for _, ck := range cks {
		if !strings.HasPrefix(ck, "__Host-") || !strings.Contains(ck, "; Secure") || !strings.Contains(ck, "Path=/") || strings.Contains(ck, "Domain=") {
			t.Errorf("behind TLS: cookie %q, want __Host-, Secure, Path=/ and no Domain", ck)
		}
	}
	resp = get(other)
	if resp.Header.Get("Strict-Transport-Security") != "" {
		t.Error("HSTS sent on an untrusted X-Forwarded-Proto")
	}
	for _, ck := range resp.Header.Values("Set-Cookie") {
		if strings.HasPrefix(ck, "__Host-") || strings.Contains(ck, "Secure") {
			t.Errorf("an untrusted X-Forwarded-Proto made cookie %q secure", ck)
		}
	}
	if m := setCookieName.FindStringSubmatch(resp.Header.Get("Set-Cookie")); m == nil || m[1] != "idemlab_csrf" {
		t.Errorf("plain HTTP cookie: %q", resp.Header.Get("Set-Cookie"))
	}
}

// runCommand runs `web args…` to its end, as main would, with bcrypt's
// least work unless env sets PASSWORD_COST (as startServer does).
func runCommand(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	getenv := func(k string) string {
		if v, ok := env[k]; ok || k != "PASSWORD_COST" {
			return v
		}
		return "4"
	}
	err := run(ctx, args, getenv, &out, testLogWriter{t})
	return out.String(), err
}

var tokenLine = regexp.MustCompile(`API token \(shown once\): (\S+)`)

func TestOutsideDemoModePeopleSignInWithPasswords(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	env := map[string]string{"DATABASE_URL": db.URL, "LOG_LEVEL": "warn", "PASSWORD": "correct horse battery"}
	out, err := runCommand(t, env, "user", "set", "alice", "-token")
	if err != nil {
		t.Fatalf("web user set: %v\n%s", err, out)
	}
	m := tokenLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no token printed: %s", out)
	}
	var hash string
	if err := db.Pool.QueryRow(context.Background(), `SELECT password_bcrypt FROM users WHERE name = 'alice'`).Scan(&hash); err != nil || !strings.HasPrefix(hash, "$2a$04$") {
		t.Errorf("alice's password hash %q (%v), want one at PASSWORD_COST 4", hash, err)
	}
	if _, err := runCommand(t, map[string]string{"DATABASE_URL": db.URL, "PASSWORD": "short"}, "user", "set", "bob"); err == nil {
		t.Error("a 5-byte password was accepted")
	}
	if _, err := runCommand(t, map[string]string{"DATABASE_URL": db.URL}, "user", "set", "Bad Name!", "-token"); err == nil {
		t.Error("a name with spaces was accepted")
	}

	s := startServerOn(t, db, map[string]string{"DEMO_MODE": "false"})
	// The demo's public tokens open nothing; the issued token does.
	if r := s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"}); r.Status != http.StatusUnauthorized {
		t.Errorf("demo-alice outside demo mode: %d", r.Status)
	}
	if r := s.do(request{Method: "GET", Path: "/api/v1/policies", Token: m[1]}); r.Status != http.StatusOK {
		t.Errorf("the issued token: %d %s", r.Status, r.Body)
	}
	client := s.browserClient()
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/signin"})
	if !bytes.Contains(page.Body, []byte(`type="password"`)) || bytes.Contains(page.Body, []byte("Sign in as")) {
		t.Fatalf("the sign-in page outside demo mode has no password form, or one-click buttons:\n%s", page.Body)
	}
	csrf := string(csrfInput.FindSubmatch(page.Body)[1])
	for _, tc := range []struct {
		name, password string
		status         int
	}{
		{"alice", "", http.StatusUnauthorized}, // one click: refused
		{"alice", "wrong password!", http.StatusUnauthorized},
		{"nobody", "correct horse battery", http.StatusUnauthorized},
		{"alice\x00", "correct horse battery", http.StatusUnprocessableEntity},
		{"alice", "correct horse battery", http.StatusSeeOther},
	} {
		r := postForm(t, s, client, "/signin", url.Values{"_csrf": {csrf}, "name": {tc.name}, "password": {tc.password}})
		if r.Status != tc.status {
			t.Errorf("sign in as %q with %q: %d, want %d", tc.name, tc.password, r.Status, tc.status)
		}
		if tc.status == http.StatusUnauthorized && !bytes.Contains(r.Body, []byte("Wrong name or password.")) {
			t.Errorf("sign in as %q: the page does not say why", tc.name)
		}
	}
	if r := doWith(t, client, s.URL, request{Method: "GET", Path: "/policies"}); r.Status != 200 {
		t.Errorf("after signing in with the password: /policies %d", r.Status)
	}
}

func TestOutsideDemoModeTheDemoTokensStopTheStart(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil) // demo mode seeds the demo accounts
	env := map[string]string{"DATABASE_URL": s.DB.URL, "ADDR": "127.0.0.1:0", "PROVIDER_ADDR": "127.0.0.1:0", "PAYMENTS_ADDR": "127.0.0.1:0", "LOG_LEVEL": "warn"}
	_, err := runCommand(t, env, "serve")
	if err == nil || !strings.Contains(err.Error(), "public demo tokens") {
		t.Fatalf("serve outside demo mode on a database with demo tokens: %v", err)
	}
	if _, err := runCommand(t, map[string]string{"CRASH_AT": "after_claim"}, "serve"); err == nil || !strings.Contains(err.Error(), "DEMO_MODE") {
		t.Errorf("CRASH_AT outside demo mode: %v", err)
	}
}

// Passwords are hashed at bcrypt cost 12 unless PASSWORD_COST says
// otherwise (the tests' 4); a cost bcrypt refuses stops the start.
func TestPasswordCost(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int{"": 12, "4": 4, "13": 13} {
		cfg, err := loadConfig(func(k string) string { return map[string]string{"PASSWORD_COST": v}[k] })
		if err != nil || cfg.PasswordCost != want {
			t.Errorf("PASSWORD_COST=%q: cost %d (%v), want %d", v, cfg.PasswordCost, err, want)
		}
	}
	for _, v := range []string{"3", "32", "twelve", "-1"} {
		if _, err := loadConfig(func(k string) string { return map[string]string{"PASSWORD_COST": v}[k] }); err == nil {
			t.Errorf("PASSWORD_COST=%q accepted", v)
		}
	}
}
