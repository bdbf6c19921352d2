package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/testenv"
)

// testServer is the real program — run(), migrations, seed, Echo, every
// middleware — listening on a random port against a fresh database.
type testServer struct {
	URL         string
	ProviderURL string // the fake provider this server calls
	PaymentsURL string // the fake payments service this server calls
	DB          *testdb.DB
	t           testing.TB
}

// startServer runs the app as main would, with env added to a minimal
// environment, and stops it when the test ends.
func startServer(t testing.TB, env map[string]string) *testServer {
	t.Helper()
	db := testdb.New(t)
	return startServerOn(t, db, env)
}

// startServerOn starts another server on an existing database (a second
// replica, or a restart).
func startServerOn(t testing.TB, db *testdb.DB, env map[string]string) *testServer {
	t.Helper()
	vars := map[string]string{
		"DATABASE_URL":   db.URL,
		"ADDR":           "127.0.0.1:0",
		"LOG_LEVEL":      "warn",
		"SESSION_SECRET": "test-session-secret",
		"PROVIDER_ADDR":  "127.0.0.1:0",
		"PAYMENTS_ADDR":  "127.0.0.1:0",
		"KAFKA_ADDR":     "127.0.0.1:0", // with EVENTS_TRANSPORT=kafka, an embedded broker of its own
		"TASKS_ADDR":     "127.0.0.1:0", // with EVENTS_TRANSPORT=tasks, a fake task queue of its own
		// The suite's budget is 60 connections (docs/testing.md), two of
		// these servers at a time: the app's default pool, and the in-process
		// fakes' small — a test that loads a fake sets its own.
		"DB_MAX_CONNS":      "8",
		"FAKE_DB_MAX_CONNS": "4",
		"NATS_URL":          testenv.NATSURL(t), // the machine's, or one embedded in the test binary
		// The tests drive the demo: demo accounts, reset, crash switch.
		"DEMO_MODE": "true",
		// bcrypt's least work: at the default 12 each hash under the race
		// detector is seconds of CPU (TestPasswordCost keeps the default).
		"PASSWORD_COST": "4",
	}
	for k, v := range env {
		vars[k] = v
	}
	getenv := func(k string) string { return vars[k] }

	ctx, cancel := context.WithCancel(context.Background())
	out := &addrWatcher{found: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve"}, getenv, out, testLogWriter{t}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("server did not shut down within 20s")
		}
	})

	select {
	case url := <-out.found:
		return &testServer{URL: url, ProviderURL: out.bannerURL("provider at "), PaymentsURL: out.bannerURL("payments at "), DB: db, t: t}
	case err := <-done:
		t.Fatalf("run ended before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("server did not start within 30s")
	}
	return nil
}

// addrWatcher reads run's stdout for the "listening on" banner line.
type addrWatcher struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	found chan string
	done  bool
}

// bannerURL is the URL on the banner line starting with prefix ("provider
// at ", "payments at "), printed before the listening line.
func (w *addrWatcher) bannerURL(prefix string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range strings.Split(w.buf.String(), "\n") {
		if _, url, ok := strings.Cut(line, prefix); ok {
			return strings.TrimSpace(url)
		}
	}
	return ""
}

func (w *addrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done {
		for _, line := range strings.Split(w.buf.String(), "\n") {
			if _, url, ok := strings.Cut(line, "listening on "); ok {
				w.done = true
				w.found <- strings.TrimSpace(url)
				break
			}
		}
	}
	return len(p), nil
}

// testLogWriter sends the server's logs to the test log, shown on failure.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Logf("server: %s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// response is an answer read in full.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test if it cannot.
func (r response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// problemType is the "type" of a problem+json body ("" otherwise).
func (r response) problemType() string {
	var p struct{ Type string }
	json.Unmarshal(r.Body, &p)
	return p.Type
}

// request is one API call: method, path, bearer token, optional body and headers.
type request struct {
	Method, Path, Token string
	Body                string
	Header              map[string]string
}

// do sends req to the server without following redirects.
func (s *testServer) do(req request) response {
	s.t.Helper()
	return doWith(s.t, noRedirectClient(nil), s.URL, req)
}

func noRedirectClient(jar http.CookieJar) *http.Client {
	return &http.Client{
		Jar: jar,
		// A bound for a server that hangs, not a speed: on a loaded machine a
		// sign-in (bcrypt, under the race detector) took over 30 s.
		Timeout:       2 * time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func doWith(t testing.TB, client *http.Client, base string, req request) response {
	t.Helper()
	var body io.Reader
	if req.Body != "" {
		body = strings.NewReader(req.Body)
	}
	r, err := http.NewRequest(req.Method, base+req.Path, body)
	if err != nil {
		t.Fatal(err)
	}
	if req.Token != "" {
		r.Header.Set("Authorization", "Bearer "+req.Token)
	}
	if req.Body != "" && r.Header.Get("Content-Type") == "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range req.Header {
		r.Header.Set(k, v)
	}
	resp, err := client.Do(r)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.Path, err)
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// browserClient is an HTTP client with a cookie jar, for the HTML routes.
func (s *testServer) browserClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return noRedirectClient(jar)
}

// postForm posts form as a browser form would, with client's cookies.
func postForm(t *testing.T, s *testServer, client *http.Client, path string, form url.Values) response {
	t.Helper()
	return doWith(t, client, s.URL, request{Method: "POST", Path: path, Body: form.Encode(),
		Header: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}})
}
