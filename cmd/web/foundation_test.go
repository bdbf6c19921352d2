package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/testdb"
)

func TestAPIRequiresAValidBearerToken(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	for _, tc := range []struct{ name, header string }{
		{"missing", ""},
		{"wrong token", "Bearer nope-nope-nope"},
		{"wrong scheme", "Basic ZGVtbzpkZW1v"},
	} {
		r := s.do(request{Method: "GET", Path: "/api/v1/policies", Header: map[string]string{"Authorization": tc.header}})
		if r.Status != http.StatusUnauthorized || r.problemType() != "unauthenticated" {
			t.Errorf("%s: got %d %s, want 401 unauthenticated", tc.name, r.Status, r.Body)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q", tc.name, ct)
		}
		if r.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: no WWW-Authenticate", tc.name)
		}
	}
	if r := s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"}); r.Status != http.StatusOK {
		t.Fatalf("with demo-alice: %d %s", r.Status, r.Body)
	}
}

type policyJSON struct {
	ID      int64  `json:"id"`
	UserID  int64  `json:"user_id"`
	Number  string `json:"number"`
	Premium string `json:"premium"`
	Status  string `json:"status"`
}

type pageJSON[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

func TestAnotherCustomersPolicyIsNotFound(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	var bobs pageJSON[policyJSON]
	s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-bob"}).JSON(t, &bobs)
	if len(bobs.Items) != demo.PoliciesPerCustomer {
		t.Fatalf("bob has %d policies", len(bobs.Items))
	}
	bobsID := bobs.Items[0].ID

	if r := s.do(request{Method: "GET", Path: fmt.Sprint("/api/v1/policies/", bobsID), Token: "demo-bob"}); r.Status != http.StatusOK {
		t.Fatalf("bob reading his own policy: %d", r.Status)
	}
	for _, path := range []string{fmt.Sprint("/api/v1/policies/", bobsID), "/api/v1/policies/999999", "/api/v1/policies/abc"} {
		r := s.do(request{Method: "GET", Path: path, Token: "demo-alice"})
		if r.Status != http.StatusNotFound || r.problemType() != "not-found" {
			t.Errorf("alice GET %s: %d %s, want 404 not-found", path, r.Status, r.Body)
		}
	}
	// The 404 for bob's policy and for a policy that does not exist are the
	// same answer, so ids reveal nothing.
	a := s.do(request{Method: "GET", Path: fmt.Sprint("/api/v1/policies/", bobsID), Token: "demo-alice"})
	b := s.do(request{Method: "GET", Path: "/api/v1/policies/999999", Token: "demo-alice"})
	if strings.ReplaceAll(string(a.Body), fmt.Sprint(bobsID), "ID") != strings.ReplaceAll(string(b.Body), "999999", "ID") {
		t.Errorf("404 bodies differ:\n%s\n%s", a.Body, b.Body)
	}
}

func TestListsPaginateWithCursor(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	var seen []int64
	path := "/api/v1/policies?limit=2"
	for pages := 0; ; pages++ {
		if pages > demo.PoliciesPerCustomer {
			t.Fatal("pagination does not end")
		}
		var p pageJSON[policyJSON]
		r := s.do(request{Method: "GET", Path: path, Token: "demo-carol"})
		if r.Status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
		}
		r.JSON(t, &p)
		for _, it := range p.Items {
			seen = append(seen, it.ID)
			if it.Status != "ACTIVE" {
				t.Errorf("policy %d status %q", it.ID, it.Status)
			}
		}
		if p.NextCursor == nil {
			break
		}
		path = "/api/v1/policies?limit=2&cursor=" + url.QueryEscape(*p.NextCursor)
	}
	if len(seen) != demo.PoliciesPerCustomer {
		t.Fatalf("paged through %v, want %d policies", seen, demo.PoliciesPerCustomer)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("ids not increasing across pages: %v", seen)
		}
	}

	var cancelled pageJSON[policyJSON]
	s.do(request{Method: "GET", Path: "/api/v1/policies?status=CANCELLED", Token: "demo-carol"}).JSON(t, &cancelled)
	if len(cancelled.Items) != 0 || cancelled.NextCursor != nil {
		t.Errorf("CANCELLED filter: %+v", cancelled)
	}

	var slotsPage pageJSON[struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	}]
	s.do(request{Method: "GET", Path: "/api/v1/slots?status=AVAILABLE&limit=1000", Token: "demo-alice"}).JSON(t, &slotsPage)
	if len(slotsPage.Items) != 7*8*(len(demo.Resources)+1) || slotsPage.NextCursor != nil {
		t.Errorf("slots: %d items, next %v", len(slotsPage.Items), slotsPage.NextCursor)
	}

	for _, bad := range []string{"limit=0", "limit=1001", "limit=x", "cursor=!!", "status=GONE"} {
		for _, base := range []string{"/api/v1/policies?", "/api/v1/slots?"} {
			if base == "/api/v1/slots?" && bad == "status=GONE" {
				continue
			}
			r := s.do(request{Method: "GET", Path: base + bad, Token: "demo-carol"})
			if r.Status != http.StatusBadRequest || r.problemType() != "invalid-parameter" {
				t.Errorf("%s%s: %d %s", base, bad, r.Status, r.Body)
			}
		}
	}
}

func TestAdminOnlyRoutesRefuseCustomers(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "GET", Path: "/api/v1/users", Token: "demo-alice"}); r.Status != http.StatusForbidden || r.problemType() != "forbidden" {
		t.Errorf("customer: %d %s, want 403", r.Status, r.Body)
	}
	var users struct {
		Items []struct{ Name, Role string }
	}
	r := s.do(request{Method: "GET", Path: "/api/v1/users", Token: "demo-admin"})
	if r.Status != http.StatusOK {
		t.Fatalf("admin: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &users)
	if len(users.Items) != 4 {
		t.Errorf("users: %+v", users.Items)
	}
}

var csrfInput = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// signIn signs client in as name through the HTML form, CSRF token and all.
func (s *testServer) signIn(t *testing.T, client *http.Client, name string) {
	t.Helper()
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/signin"})
	m := csrfInput.FindSubmatch(page.Body)
	if m == nil {
		t.Fatalf("no CSRF field on /signin: %s", page.Body)
	}
	form := url.Values{"_csrf": {string(m[1])}, "name": {name}}
	r := doWith(t, client, s.URL, request{Method: "POST", Path: "/signin", Body: form.Encode(),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	if r.Status != http.StatusSeeOther {
		t.Fatalf("sign in as %s: %d %s", name, r.Status, r.Body)
	}
}

func TestFormsNeedTheirCSRFToken(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	client := s.browserClient()
	// Without the token: 403, and no session.
	r := doWith(t, client, s.URL, request{Method: "POST", Path: "/signin", Body: "name=alice",
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	if r.Status != http.StatusForbidden {
		t.Fatalf("POST /signin without CSRF token: %d, want 403", r.Status)
	}
	if !bytes.Contains(r.Body, []byte("<html")) {
		t.Errorf("browser error is not an HTML page: %s", r.Body)
	}
	if r := doWith(t, client, s.URL, request{Method: "GET", Path: "/policies"}); r.Status != http.StatusSeeOther {
		t.Fatalf("signed-out /policies: %d, want 303 to /signin", r.Status)
	}
	// A token from another browser does not help either.
	other := s.browserClient()
	page := doWith(t, other, s.URL, request{Method: "GET", Path: "/signin"})
	m := csrfInput.FindSubmatch(page.Body)
	r = doWith(t, client, s.URL, request{Method: "POST", Path: "/signin", Body: "name=alice&_csrf=" + string(m[1]),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	if r.Status != http.StatusForbidden {
		t.Fatalf("POST /signin with another browser's token: %d, want 403", r.Status)
	}

	s.signIn(t, client, "alice")
	r = doWith(t, client, s.URL, request{Method: "GET", Path: "/policies"})
	if r.Status != 200 || !bytes.Contains(r.Body, []byte("POL-ALICE-001")) || bytes.Contains(r.Body, []byte("POL-BOB-001")) {
		t.Fatalf("alice's policies page: %d\n%s", r.Status, r.Body)
	}
}

func TestOversizedBodyIs413(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"BODY_LIMIT": "64K"})
	big := strings.Repeat("x", 100<<10)
	r := s.do(request{Method: "POST", Path: "/api/v1/policies/1/cancel", Token: "demo-alice", Body: `{"reason":"` + big + `"}`})
	if r.Status != http.StatusRequestEntityTooLarge || r.problemType() != "body-too-large" {
		t.Fatalf("API: %d %s, want 413 body-too-large", r.Status, r.Body)
	}
	r = doWith(t, s.browserClient(), s.URL, request{Method: "POST", Path: "/signin", Body: "name=" + big,
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
	if r.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("form: %d, want 413", r.Status)
	}
}

func TestUnknownRoutes(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	r := s.do(request{Method: "GET", Path: "/api/v1/nothing-here", Token: "demo-alice"})
	if r.Status != 404 || r.problemType() != "not-found" {
		t.Errorf("API: %d %s", r.Status, r.Body)
	}
	r = s.do(request{Method: "GET", Path: "/nothing-here"})
	if r.Status != 404 || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		t.Errorf("browser: %d %s %s", r.Status, r.Header.Get("Content-Type"), r.Body)
	}
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"DB_MAX_CONNS": "6"}) // the gauge below reads it
	if r := s.do(request{Method: "GET", Path: "/healthz"}); r.Status != 200 {
		t.Fatalf("healthz: %d", r.Status)
	}
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != 200 {
		t.Fatalf("readyz: %d %s", r.Status, r.Body)
	}
	s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"})
	m := s.do(request{Method: "GET", Path: "/metrics"})
	for _, want := range []string{
		`idemlab_http_requests_total{method="GET",route="/api/v1/policies",status="200"} 1`,
		"idemlab_http_request_duration_seconds_bucket",
		"idemlab_db_pool_max_conns 6",
	} {
		if !bytes.Contains(m.Body, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestReadyzFailsWhileTheDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != 200 {
		t.Fatalf("readyz before: %d", r.Status)
	}
	// Take the database away under the running server.
	admin := testdb.New(t) // any connection to the server will do
	if _, err := admin.Pool.Exec(context.Background(), fmt.Sprintf(`DROP DATABASE %s WITH (FORCE)`, s.DB.Name)); err != nil {
		t.Fatal(err)
	}
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("readyz with the database gone: %d %s, want 503", r.Status, r.Body)
	}
	if r := s.do(request{Method: "GET", Path: "/healthz"}); r.Status != 200 {
		t.Fatalf("healthz must stay 200 (the process is up): %d", r.Status)
	}
}

func TestReadyzFailsWhenMigrationsArePending(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	var out bytes.Buffer
	getenv := func(k string) string {
		return map[string]string{"DATABASE_URL": s.DB.URL, "LOG_LEVEL": "error"}[k]
	}
	if err := run(context.Background(), []string{"migrate", "down"}, getenv, &out, &out); err != nil {
		t.Fatalf("migrate down: %v\n%s", err, out.String())
	}
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("readyz one migration behind: %d %s", r.Status, r.Body)
	}
	if err := run(context.Background(), []string{"migrate", "up"}, getenv, &out, &out); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"migrate", "status"}, getenv, &out, &out); err != nil || strings.Contains(out.String(), "pending") {
		t.Fatalf("migrate status: %v\n%s", err, out.String())
	}
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != 200 {
		t.Fatalf("readyz after migrate up: %d %s", r.Status, r.Body)
	}
}

func TestBadConfigurationIsRefused(t *testing.T) {
	for _, env := range []map[string]string{
		{"DB_MAX_CONNS": "zero"},
		{"LOG_FORMAT": "xml"},
		{"LOG_LEVEL": "loud"},
		{"DEMO_TOKENS": "mallory=secret-secret"},
	} {
		err := run(context.Background(), nil, func(k string) string { return env[k] }, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Errorf("run with %v started", env)
		}
	}
}
