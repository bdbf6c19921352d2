package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// assertRateLimited checks a 429: Retry-After in whole seconds, and for the
// API the rate-limited problem naming the limit.
func assertRateLimited(t *testing.T, what string, r response, limit string) {
	t.Helper()
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("%s: %d %s, want 429", what, r.Status, r.Body)
	}
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("%s: Retry-After %q", what, r.Header.Get("Retry-After"))
	}
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var p struct{ Type, Limit string }
		r.JSON(t, &p)
		if p.Type != "rate-limited" || p.Limit != limit {
			t.Errorf("%s: %s, want rate-limited %s", what, r.Body, limit)
		}
	}
	assertSecurityHeaders(t, what, r.Header)
}

// countStatuses sends n requests made by mk and counts the answers by status.
func countStatuses(n int, send func(i int) response) (map[int]int, response) {
	counts := map[int]int{}
	var last response
	for i := range n {
		r := send(i)
		counts[r.Status]++
		if r.Status == http.StatusTooManyRequests {
			last = r
		}
	}
	return counts, last
}

func TestSignInIsRateLimitedPerAddress(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	counts, limited := countStatuses(30, func(int) response {
		client := s.browserClient() // a new browser each time, one address
		page := doWith(t, client, s.URL, request{Method: "GET", Path: "/signin"})
		csrf := string(csrfInput.FindSubmatch(page.Body)[1])
		return postForm(t, s, client, "/signin", url.Values{"_csrf": {csrf}, "name": {"alice"}})
	})
	if counts[http.StatusSeeOther] != 10 || counts[http.StatusTooManyRequests] != 20 {
		t.Fatalf("30 sign-ins: %v, want 10 signed in and 20 refused (RATE_LIMIT_SIGNIN=10/m)", counts)
	}
	assertRateLimited(t, "the 11th sign-in", limited, "sign-in")
	var sessions int
	s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM sessions`).Scan(&sessions)
	if sessions != 10 {
		t.Errorf("%d sessions after 10 sign-ins and 20 refusals, want 10", sessions)
	}
}

func TestBadTokensAreRateLimitedPerAddress(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	counts, limited := countStatuses(30, func(i int) response {
		return s.do(request{Method: "GET", Path: "/api/v1/policies", Token: fmt.Sprintf("guess-%04d", i)})
	})
	if counts[http.StatusUnauthorized] != 20 || counts[http.StatusTooManyRequests] != 10 {
		t.Fatalf("30 bad tokens: %v, want 20 × 401 then 10 × 429 (RATE_LIMIT_BAD_TOKEN=20/m)", counts)
	}
	assertRateLimited(t, "the 21st bad token", limited, "bad-token")
	// The address is refused before its next guess is even looked up —
	// a good token from it too, until the bucket refills.
	assertRateLimited(t, "a good token from the same address", s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"}), "bad-token")

	// RATE_LIMIT_EXEMPT: a load generator's host is never limited.
	free := startServer(t, map[string]string{"RATE_LIMIT_EXEMPT": "127.0.0.0/8"})
	counts, _ = countStatuses(30, func(i int) response {
		return free.do(request{Method: "GET", Path: "/api/v1/policies", Token: fmt.Sprintf("guess-%04d", i)})
	})
	if counts[http.StatusUnauthorized] != 30 {
		t.Errorf("an exempt address: %v, want 30 × 401", counts)
	}
}

func TestWritesAreRateLimitedPerUserAndNothingIsWrittenPastTheLimit(t *testing.T) {
	t.Parallel()
	// 20 an hour, a burst of 20: the same bucket as the default 20/s, but one
	// that does not refill while a slow machine sends the 100 (at 20/s, 100
	// bookings taking over five seconds were all allowed, rightly).
	s := startServer(t, map[string]string{"RATE_LIMIT_WRITES_PER_USER": "20/h"})
	counts, limited := countStatuses(100, func(i int) response {
		return s.do(request{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", i+1), Token: "demo-alice",
			Header: map[string]string{"Idempotency-Key": fmt.Sprintf("book-%03d", i)}})
	})
	if counts[http.StatusCreated] != 20 || counts[http.StatusTooManyRequests] != 80 {
		t.Fatalf("100 bookings in a row: %v, want the first 20 booked and the other 80 refused", counts)
	}
	assertRateLimited(t, "a booking past the limit", limited, "writes-per-user")
	var bookings, keys int
	s.DB.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM bookings), (SELECT count(*) FROM idempotency_keys)`).Scan(&bookings, &keys)
	if bookings != counts[http.StatusCreated] || keys != counts[http.StatusCreated] {
		t.Fatalf("%d bookings and %d keys for %d × 201: a refused request wrote something", bookings, keys, counts[http.StatusCreated])
	}
	// Another user is not slowed down by alice.
	if r := s.do(request{Method: "POST", Path: "/api/v1/slots/150/book", Token: "demo-bob", Header: map[string]string{"Idempotency-Key": "bob-1"}}); r.Status != http.StatusCreated {
		t.Errorf("bob after alice's flood: %d %s", r.Status, r.Body)
	}
	// Reads are not writes.
	if r := s.do(request{Method: "GET", Path: "/api/v1/bookings", Token: "demo-alice"}); r.Status != http.StatusOK {
		t.Errorf("alice reading after her flood: %d", r.Status)
	}
}

func TestLabsAreRateLimitedPerUser(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"RATE_LIMIT_LABS": "4/m"}) // the default lets a person through every lab: a smaller one to reach
	client := s.browserClient()
	s.signIn(t, client, "alice")
	page := doWith(t, client, s.URL, request{Method: "GET", Path: "/labs/race"})
	csrf := string(csrfInput.FindSubmatch(page.Body)[1])
	counts, limited := countStatuses(5, func(int) response {
		return postForm(t, s, client, "/labs/race", url.Values{"_csrf": {csrf}, "slot": {"fresh"}, "racers": {"2"},
			"strategy": {"conditional-update"}, "think_ms": {"0"}})
	})
	if counts[http.StatusOK] != 4 || counts[http.StatusTooManyRequests] != 1 {
		t.Fatalf("five races in a row: %v, want 4 run and the fifth refused (RATE_LIMIT_LABS=4/m)", counts)
	}
	assertRateLimited(t, "the fifth race", limited, "labs")
	// The browser's 429 is not a dead end (issue 29, finding 22): it says
	// when to try again and leads back to the page the form was on; an htmx
	// request gets the same words alone, for the panel it swaps.
	form := url.Values{"_csrf": {csrf}, "slot": {"fresh"}, "racers": {"2"}, "strategy": {"conditional-update"}, "think_ms": {"0"}}
	for _, htmx := range []bool{false, true} {
		h := map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Referer": s.URL + "/labs/race"}
		if htmx {
			h["HX-Request"] = "true"
		}
		r := doWith(t, client, s.URL, request{Method: "POST", Path: "/labs/race", Body: form.Encode(), Header: h})
		assertRateLimited(t, "a race page refused", r, "labs")
		body := string(r.Body)
		secs := r.Header.Get("Retry-After")
		for _, want := range []string{`data-testid="rate-limited"`, "Try again in <strong>" + secs + " s</strong>, at ", " UTC",
			`href="/labs/race" data-testid="rate-limited-back"`, `href="/labs"`} {
			if !strings.Contains(body, want) {
				t.Errorf("htmx %v: the 429 page does not say %q:\n%s", htmx, want, body)
			}
		}
		if strings.Contains(body, "<html") == htmx {
			t.Errorf("htmx %v: a whole page %v", htmx, !htmx)
		}
	}
}

func TestBadRateLimitSettingsStopTheStart(t *testing.T) {
	t.Parallel()
	for _, env := range []map[string]string{
		{"RATE_LIMIT_SIGNIN": "lots"},
		{"RATE_LIMIT_LABS": "5/day"},
		{"RATE_LIMIT_WRITES_PER_USER": "-1/s"},
		{"RATE_LIMIT_EXEMPT": "localhost"},
	} {
		if _, err := loadConfig(func(k string) string { return env[k] }); err == nil {
			t.Errorf("%v: accepted", env)
		}
	}
	cfg, err := loadConfig(func(k string) string {
		return map[string]string{"RATE_LIMIT_SIGNIN": "off", "RATE_LIMIT_LABS": "30/h"}[k]
	})
	if err != nil || cfg.RateLimits.SignIn.Events != 0 || cfg.RateLimits.Labs.String() != "30/h" {
		t.Errorf("off and 30/h: %+v %v", cfg.RateLimits, err)
	}
}

// Two replicas on one database share the buckets: alice's writes spread
// over both get the documented rate once, not twice.
func TestRateLimitsHoldAcrossReplicas(t *testing.T) {
	t.Parallel()
	env := map[string]string{"RATE_LIMIT_WRITES_PER_USER": "10/m"}
	a := startServer(t, env)
	b := startServerOn(t, a.DB, env)
	counts, limited := countStatuses(20, func(i int) response {
		s := []*testServer{a, b}[i%2]
		return s.do(request{Method: "POST", Path: "/api/v1/policies/999999/cancel", Token: "demo-alice",
			Header: map[string]string{"Idempotency-Key": fmt.Sprintf("spread-%02d", i)}})
	})
	// 10 at once, then one every 6 s: 11 if the run outlasted a refill.
	if passed := 20 - counts[http.StatusTooManyRequests]; passed < 10 || passed > 11 {
		t.Fatalf("20 writes spread over two replicas: %v, want 10 through (one bucket), not 20", counts)
	}
	assertRateLimited(t, "a write past the shared limit", limited, "writes-per-user")
}
