package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/provider/fake"
)

// The security tests of the HTTP plumbing: methods, body limits, request
// ids, headers, the words of a refusal. hostile_test.go runs the same
// kinds of request over every route.

// securityHeaders are on every answer, refusals included.
var securityHeaders = []string{"X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy", "Referrer-Policy"}

func assertSecurityHeaders(t *testing.T, what string, h http.Header) {
	t.Helper()
	for _, name := range securityHeaders {
		if h.Get(name) == "" {
			t.Errorf("%s: no %s header", what, name)
		}
	}
}

func TestWrongMethodIs405WithAllow(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/api/v1/policies", "GET"},
		{"DELETE", "/api/v1/policies/1", "GET"},
		{"HEAD", "/api/v1/slots", "GET"},
		{"OPTIONS", "/api/v1/slots", "GET"},
		{"OPTIONS", "/api/v1/policies/1/cancel", "POST"},
		{"GET", "/api/v1/slots/1/book", "POST"},
		{"PATCH", "/api/v1/admin/crash", "GET, PUT"},
		{"PUT", "/signin", "GET, POST"},
	} {
		r := s.do(request{Method: tc.method, Path: tc.path, Token: "demo-alice"})
		if r.Status != http.StatusMethodNotAllowed || r.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", tc.method, tc.path, r.Status, r.Header.Get("Allow"), tc.allow)
		}
		if strings.HasPrefix(tc.path, "/api/") && tc.method != "HEAD" && r.problemType() != "method-not-allowed" {
			t.Errorf("%s %s: %s, want problem method-not-allowed", tc.method, tc.path, r.Body)
		}
		assertSecurityHeaders(t, tc.method+" "+tc.path, r.Header)
	}
	// Unknown paths stay 404, with or without a token.
	for _, path := range []string{"/api/v1/nothing", "/api/v1/policies/1/nothing"} {
		if r := s.do(request{Method: "POST", Path: path}); r.Status != http.StatusNotFound || r.problemType() != "not-found" {
			t.Errorf("POST %s: %d %s, want 404", path, r.Status, r.Body)
		}
	}
}

// chunked is a body whose length the client does not announce: it goes out
// with Transfer-Encoding: chunked.
type chunked struct{ r io.Reader }

func (c chunked) Read(p []byte) (int, error) { return c.r.Read(p) }

func TestOversizedBodiesAre413EverywherePlainAndChunked(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"BODY_LIMIT": "64K"})
	big := `{"reason":"` + strings.Repeat("x", 100<<10) + `"}`
	form := "name=" + strings.Repeat("x", 100<<10)
	for _, tc := range []struct {
		path, contentType, body string
		api                     bool
	}{
		{"/api/v1/policies/1/cancel", "application/json", big, true},
		{"/api/v1/admin/reset", "application/json", big, true},
		{"/api/v1/nothing-here", "application/json", big, true},
		{"/signin", "application/x-www-form-urlencoded", form, false},
		{"/policies/1/cancel", "application/x-www-form-urlencoded", form, false},
	} {
		for _, enc := range []string{"plain", "chunked"} {
			var body io.Reader = strings.NewReader(tc.body)
			if enc == "chunked" {
				body = chunked{body}
			}
			req, _ := http.NewRequest("POST", s.URL+tc.path, body)
			req.Header.Set("Content-Type", tc.contentType)
			req.Header.Set("Authorization", "Bearer demo-admin")
			req.Header.Set("Idempotency-Key", "k-big-"+enc)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", enc, tc.path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s: %d %s, want 413", enc, tc.path, resp.StatusCode, b)
				continue
			}
			if tc.api && !strings.Contains(string(b), `"type":"body-too-large"`) {
				t.Errorf("%s %s: %s, want problem body-too-large", enc, tc.path, b)
			}
			if strings.Contains(string(b), "code=413") || strings.Contains(string(b), "message=") {
				t.Errorf("%s %s: the framework's text leaks: %s", enc, tc.path, b)
			}
			assertSecurityHeaders(t, enc+" "+tc.path, resp.Header)
		}
	}
}

// rawRequest sends bytes as they are — what net/http's client refuses to
// send (control characters in headers) — and returns the status line's code.
func rawRequest(t *testing.T, base, raw string) (int, string) {
	t.Helper()
	u, _ := url.Parse(base)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("raw request: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHostileRequestIDsAreReplacedNotStored(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	pid := s.policyOf(t, "demo-alice", 1)
	bad := "req-\xff\xfe-" + strings.Repeat("z", 10) // invalid UTF-8
	r := s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", pid), Token: "demo-alice",
		Header: map[string]string{"Idempotency-Key": "k-rid", "X-Request-Id": bad}})
	if r.Status != http.StatusOK {
		t.Fatalf("cancel with a hostile X-Request-Id: %d %s", r.Status, r.Body)
	}
	id := r.Header.Get("X-Request-Id")
	if id == "" || id == bad || !validRequestIDForTest(id) {
		t.Fatalf("X-Request-Id answered %q, want a fresh id", id)
	}
	var actors string
	s.DB.Pool.QueryRow(context.Background(), `SELECT string_agg(actor, ' | ') FROM operation_events`).Scan(&actors)
	if strings.Contains(actors, "\xff") || !strings.Contains(actors, id) {
		t.Fatalf("the timeline's actors %q do not carry the replacement id %q", actors, id)
	}
	// A good client id is kept, so a client can correlate its logs with ours.
	if r := s.do(request{Method: "GET", Path: "/healthz", Header: map[string]string{"X-Request-Id": "client-123"}}); r.Header.Get("X-Request-Id") != "client-123" {
		t.Errorf("a valid X-Request-Id was replaced: %q", r.Header.Get("X-Request-Id"))
	}
	// Control characters in a header never reach the app: net/http refuses
	// the request itself, with a 400.
	code, _ := rawRequest(t, s.URL, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\x01b\r\nConnection: close\r\n\r\n")
	if code != http.StatusBadRequest {
		t.Errorf("a control character in X-Request-Id: %d, want 400", code)
	}
}

func validRequestIDForTest(id string) bool {
	for _, r := range id {
		if r < 0x21 || r > 0x7E {
			return false
		}
	}
	return len(id) > 0 && len(id) <= 128
}

func TestRefusalsSpeakTheAPINotGo(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	pid := s.policyOf(t, "demo-alice", 1)
	cancel := fmt.Sprintf("/api/v1/policies/%d/cancel", pid)
	long := strings.Repeat("n", 600)
	for _, tc := range []struct {
		name         string
		req          request
		status       int
		typ, field   string
		detailSubstr string
	}{
		{"reason of the wrong type", request{Method: "POST", Path: cancel, Token: "demo-alice", Body: `{"reason": 5}`,
			Header: map[string]string{"Idempotency-Key": "k1"}}, 400, "invalid-json", "reason", "reason must be a string"},
		{"NUL in reason", request{Method: "POST", Path: cancel, Token: "demo-alice", Body: `{"reason": "a\u0000b"}`,
			Header: map[string]string{"Idempotency-Key": "k2"}}, 422, "validation-failed", "reason", "control characters"},
		{"invalid UTF-8 in reason", request{Method: "POST", Path: cancel, Token: "demo-alice", Body: "{\"reason\": \"a\xffb\"}",
			Header: map[string]string{"Idempotency-Key": "k3"}}, 400, "invalid-json", "", "UTF-8"},
		{"dataset of the wrong type", request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `{"users": "many"}`},
			400, "invalid-json", "users", "users must be a whole number"},
		{"dataset out of range", request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `{"users": 99999999}`},
			422, "validation-failed", "users", "users must be 0 to 10000"},
		{"dataset not an object", request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `[1,2]`},
			400, "invalid-json", "", "users, policies_per_user, slots"},
		{"unknown field", request{Method: "POST", Path: "/api/v1/slots/1/book", Token: "demo-alice", Body: `{"slot": 1}`,
			Header: map[string]string{"Idempotency-Key": "k4"}}, 400, "invalid-json", "slot", `"slot" is not a field`},
		{"a note too long", request{Method: "POST", Path: "/api/v1/admin/operations/1/resolve", Token: "demo-admin",
			Body:   `{"action":"retry","seen_updated_at":"2026-01-01T00:00:00Z","note":"` + long + `"}`,
			Header: map[string]string{"Idempotency-Key": "k5"}}, 422, "validation-failed", "note", "note must be at most 500 bytes"},
		{"a time that is not one", request{Method: "POST", Path: "/api/v1/admin/operations/1/resolve", Token: "demo-admin",
			Body: `{"action":"retry","seen_updated_at":"yesterday"}`, Header: map[string]string{"Idempotency-Key": "k6"}},
			400, "invalid-json", "", "RFC 3339"},
	} {
		r := s.do(tc.req)
		var p struct {
			Type, Detail, Field string
		}
		r.JSON(t, &p)
		if r.Status != tc.status || p.Type != tc.typ || p.Field != tc.field || !strings.Contains(p.Detail, tc.detailSubstr) {
			t.Errorf("%s: %d %s, want %d %s field %q detail ~%q", tc.name, r.Status, r.Body, tc.status, tc.typ, tc.field, tc.detailSubstr)
		}
		assertNoInternals(t, tc.name, string(r.Body))
	}
}

// internals are what an answer must never carry: Go's type names
// (main.cancelBody, demo.Dataset), package prefixes of error texts
// ("slots: …"), the framework's and the driver's text, addresses, stacks.
var internals = regexp.MustCompile(`\b(main|web|demo|policies|slots|users|fake|fault|external|provider|idempotency|recovery|crash|events|time|json)\.[A-Z]` +
	`|\b(main|web|demo|policies|slots|users|fake|fault|external|idempotency|crash|json|pgx|bcrypt): ` +
	`|Go struct|code=\d|SQLSTATE|127\.0\.0\.1|localhost:\d|goroutine \d|runtime\.|\.go:\d`)

// codeLink is a link into the code viewer, with its text.
var codeLink = regexp.MustCompile(`(?s)<a [^>]*href="/code/[^"]*"[^>]*>.*?</a>`)

func assertNoInternals(t *testing.T, what, body string) {
	t.Helper()
	// A link into the code viewer names a file and line of idemlab's own
	// source, which /code serves to everyone: a lesson, not a leak. What is
	// left must show no internals.
	body = codeLink.ReplaceAllString(body, "")
	if m := internals.FindString(body); m != "" {
		t.Errorf("%s: the answer shows internals (%q): %s", what, m, body)
	}
}

// The race lab works on its own data (schema race_lab) and within bounds:
// a think time that would overflow, or the id of a customer's slot, is
// refused 422 naming the field, and nothing changes; a race creates no user
// and leaves the business tables alone.
func TestRaceLabIsBoundedAndStaysInItsOwnData(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "off", "EVENTS_WORKERS": "off"}) // snapshots: nothing writes behind them
	if r := s.do(request{Method: "POST", Path: "/api/v1/slots/1/book", Token: "demo-bob", Header: map[string]string{"Idempotency-Key": "bob-slot-1"}}); r.Status != http.StatusCreated {
		t.Fatalf("bob books slot 1: %d %s", r.Status, r.Body)
	}
	client := s.browserClient()
	s.signIn(t, client, "alice")
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs/race"})
	csrf := string(csrfInput.FindSubmatch(page.Body)[1])
	race := func(slot, racers, think string) response {
		return postForm(t, s, client, "/labs/race", url.Values{"_csrf": {csrf}, "slot": {slot}, "racers": {racers},
			"strategy": {"conditional-update"}, "think_ms": {think}})
	}
	before := snapshotDB(t, s.DB.Pool)
	for _, tc := range []struct{ slot, racers, think, field string }{
		{"fresh", "16", "18446744073710", "think_ms"},
		{"fresh", "16", "-1", "think_ms"},
		{"fresh", "9223372036854775807", "0", "racers"},
		{"fresh", "65", "0", "racers"},
		{"1", "4", "0", "slot"}, // bob's booked slot of the demo week
		{"2", "4", "0", "slot"}, // a free slot of the demo week
		{"1 OR 1=1", "4", "0", "slot"},
	} {
		r := race(tc.slot, tc.racers, tc.think)
		if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "("+tc.field+")") {
			t.Errorf("race slot=%q racers=%q think=%q: %d, want 422 naming %s", tc.slot, tc.racers, tc.think, r.Status, tc.field)
		}
		assertNoInternals(t, "race "+tc.field, string(r.Body))
	}
	if after := snapshotDB(t, s.DB.Pool); !bytes.Equal(before.digest(), after.digest()) {
		t.Fatalf("refused races changed the database:\n%s", before.diff(after))
	}
	if r := race("fresh", "8", "0"); r.Status != http.StatusOK {
		t.Fatalf("a good race: %d", r.Status)
	}
	after := snapshotDB(t, s.DB.Pool)
	for table, st := range after {
		if st != before[table] && !strings.HasPrefix(table, "race_lab.") {
			t.Errorf("a race changed %s", table)
		}
	}
}

// A customer reads what a status means, never the error text recorded for
// operators (which names the provider's address); an admin reads it all.
func TestCustomersReadSummariesNotInternals(t *testing.T) {
	t.Parallel()
	for _, mode := range []fake.Mode{fake.ModeError, fake.ModeDrop, fake.ModeReject} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "1h"})
			s.setFaults(t, func(f *fake.Fault) { f.Mode = mode })
			pid := s.policyOf(t, "demo-alice", 0)
			r := s.do(cancelReq(pid, "demo-alice", "k-"+string(mode), ""))
			assertNoInternals(t, "the cancel answer", string(r.Body))
			var op struct {
				ID          int64 `json:"id"`
				OperationID int64 `json:"operation_id"`
			}
			r.JSON(t, &op)
			id := max(op.ID, op.OperationID)
			if id == 0 {
				t.Fatalf("no operation in %s", r.Body)
			}
			// Stop the provider answering status queries, so its error shows too.
			s.setFaults(t, func(f *fake.Fault) { f.Mode = mode; f.StatusMode = "error" })
			path := fmt.Sprintf("/api/v1/operations/%d", id)
			mine := s.do(request{Method: "GET", Path: path, Token: "demo-alice"})
			assertNoInternals(t, "the customer's operation", string(mine.Body))
			var got struct {
				LastError *string `json:"last_error"`
			}
			mine.JSON(t, &got)
			if got.LastError == nil || !strings.HasPrefix(*got.LastError, "The provider") {
				t.Errorf("the customer's last_error: %v, want a summary", got.LastError)
			}
			for _, p := range []string{"/api/v1/recovery", fmt.Sprintf("/operations/%d", id), "/recovery"} {
				client := s.browserClient()
				s.signIn(t, client, "alice")
				var r response
				if strings.HasPrefix(p, "/api/") {
					r = s.do(request{Method: "GET", Path: p, Token: "demo-alice"})
				} else {
					r = doWith(t, client, s.URL, request{Method: "GET", Path: p})
				}
				assertNoInternals(t, "the customer's "+p, string(r.Body))
			}
			admins := s.do(request{Method: "GET", Path: path, Token: "demo-admin"})
			if admins.Status != 200 || bytes.Equal(admins.Body, mine.Body) {
				t.Errorf("the admin's view: %d, the same as the customer's", admins.Status)
			}
		})
	}
}

// FuzzTrustedProxies: TRUSTED_PROXIES is read as addresses and CIDR
// ranges, or refused; an accepted list contains exactly its items.
func FuzzTrustedProxies(f *testing.F) {
	for _, s := range []string{"", "127.0.0.1", "10.0.0.0/8, 192.0.2.7", "::1", "2001:db8::/32", "localhost", "10.0.0.0/33", ",,", "1.2.3.4/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		nets, err := parseNets(spec)
		if err != nil {
			return
		}
		items := 0
		for _, it := range strings.Split(spec, ",") {
			if strings.TrimSpace(it) != "" {
				items++
			}
		}
		if len(nets) != items {
			t.Fatalf("%q: %d ranges from %d items", spec, len(nets), items)
		}
		for _, n := range nets {
			if n == nil || n.IP == nil {
				t.Fatalf("%q: a nil range", spec)
			}
		}
	})
}
