package external_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// The fakes' tests (internal/provider/fake, internal/payments/fake) run the
// real clients against every fault mode. These tests cover what a fake never
// says: odd statuses, bodies that make no sense, a system that is not there.

// stub serves one fixed answer, counts the requests it receives and keeps
// the last one's headers.
type stub struct {
	*httptest.Server
	hits   atomic.Int64
	header atomic.Pointer[http.Header]
}

func newStub(t *testing.T, status int, body string) *stub {
	t.Helper()
	s := &stub{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		h := r.Header.Clone()
		s.header.Store(&h)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

func client(t *testing.T, url string, timeout time.Duration) *external.Client {
	t.Helper()
	c := external.NewClient("testsys", url, timeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

var call = external.Call{Path: "/v1/things", Key: "op-1:step", Body: map[string]any{"id": 7}}

func TestSendClassifiesByStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		body    string
		outcome external.Outcome
		truth   external.Truth
		reason  string
		code    string
	}{
		{"200 is confirmed", 200, `{"status":"COMPLETED"}`, external.Confirmed, external.TruthCompleted, "", ""},
		{"200 is confirmed whatever the body", 200, `not json`, external.Confirmed, external.TruthCompleted, "", ""},
		{"422 is rejected, with the reason", 422, `{"status":"REJECTED","reason":"already lapsed"}`, external.Rejected, external.TruthRejected, "already lapsed", ""},
		{"202 is unknown: still running", 202, `{"status":"RUNNING"}`, external.Unknown, external.TruthRunning, "", ""},
		{"503 is unknown", 503, `{"error":"unavailable"}`, external.Unknown, "", "", "unavailable"},
		{"500 is unknown", 500, ``, external.Unknown, "", "", ""},
		{"409 is unknown", 409, `{"error":"key_reused"}`, external.Unknown, "", "", "key_reused"},
		{"a deadline refusal is unknown", 409, `{"error":"deadline_passed","status":"NOT_STARTED"}`, external.Unknown, "", "", "deadline_passed"},
		{"404 is unknown", 404, `<html>`, external.Unknown, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newStub(t, tt.status, tt.body)
			res, err := client(t, srv.URL, 5*time.Second).Send(context.Background(), call)
			if err != nil {
				t.Fatalf("err = %v: a sent request is classified, not an error", err)
			}
			if res.Outcome != tt.outcome || res.Truth != tt.truth || res.Reason != tt.reason {
				t.Fatalf("result = %+v, want %s, truth %q, reason %q", res, tt.outcome, tt.truth, tt.reason)
			}
			if (res.Outcome == external.Unknown) != (res.Err != nil) {
				t.Fatalf("Err = %v: set exactly when the outcome is unknown", res.Err)
			}
			var se *external.StatusError
			if res.Outcome == external.Unknown && res.Truth == "" &&
				(!errors.As(res.Err, &se) || se.StatusCode != tt.status || se.Code != tt.code) {
				t.Fatalf("cause = %v, want a StatusError %d with code %q", res.Err, tt.status, tt.code)
			}
			if res.Deadline.IsZero() {
				t.Fatal("the result does not say which deadline the call carried")
			}
		})
	}
}

func TestSendCarriesKeyAndDeadline(t *testing.T) {
	t.Parallel()
	srv := newStub(t, 200, `{"status":"COMPLETED"}`)
	c := client(t, srv.URL, 3*time.Second)

	t.Run("chosen by the client: now plus the timeout", func(t *testing.T) {
		before := time.Now()
		res, err := c.Send(context.Background(), call)
		if err != nil {
			t.Fatal(err)
		}
		h := *srv.header.Load()
		if got := h.Get("Idempotency-Key"); got != call.Key {
			t.Errorf("Idempotency-Key = %q", got)
		}
		raw := h.Get(external.DeadlineHeader)
		if !strings.HasSuffix(raw, "Z") || len(raw) != len("2006-01-02T15:04:05.000Z") {
			t.Fatalf("%s = %q, want RFC 3339 UTC with milliseconds", external.DeadlineHeader, raw)
		}
		sent, err := external.ParseDeadline(raw)
		if err != nil {
			t.Fatal(err)
		}
		if !sent.Equal(res.Deadline) {
			t.Errorf("header says %s, Result.Deadline says %s", sent, res.Deadline)
		}
		// Rounded up to the header's millisecond (Client.Deadline): never
		// before now plus the timeout, at most a millisecond after it.
		lo, hi := before.Add(3*time.Second), time.Now().Add(3*time.Second).Add(time.Millisecond)
		if sent.Before(lo) || sent.After(hi) {
			t.Errorf("deadline %s not within [%s, %s]: caller's clock plus the timeout", sent, lo, hi)
		}
	})

	t.Run("chosen by the caller before sending", func(t *testing.T) {
		want := c.Deadline()
		res, err := c.Send(context.Background(), external.Call{Path: call.Path, Key: call.Key, Body: call.Body, Deadline: want})
		if err != nil {
			t.Fatal(err)
		}
		h := *srv.header.Load()
		if got := h.Get(external.DeadlineHeader); got != external.FormatDeadline(want) || !res.Deadline.Equal(want) {
			t.Errorf("sent %s, result %s; want the caller's %s", got, res.Deadline, external.FormatDeadline(want))
		}
	})
}

func TestTheClientGivesUpAtTheDeadline(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // hold the answer until the caller leaves
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	c := client(t, srv.URL, time.Minute) // the timeout would wait long…
	deadline := time.Now().Add(300 * time.Millisecond)
	res, err := c.Send(context.Background(), external.Call{Path: "/x", Key: "k", Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	// …but the caller's deadline is the moment it stops waiting.
	if res.Outcome != external.Unknown || !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Fatalf("result = %+v, want Unknown from the deadline", res)
	}
	if late := time.Since(deadline); late > 5*time.Second {
		t.Fatalf("the client waited %v past its deadline", late)
	}
	if strings.Contains(res.Err.Error(), srv.Listener.Addr().String()) {
		t.Errorf("the cause names the system's address: %v", res.Err)
	}
}

func TestSendWithNobodyListeningIsUnknown(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	res, err := client(t, "http://"+addr, time.Second).Send(context.Background(), call)
	if err != nil || res.Outcome != external.Unknown || res.Err == nil {
		t.Fatalf("result = %+v, %v; want Unknown with the connection error", res, err)
	}
	if strings.Contains(res.Err.Error(), addr) {
		t.Errorf("the cause names the system's address: %v", res.Err)
	}
	var op *net.OpError
	if !errors.As(res.Err, &op) {
		t.Errorf("the network error is not reachable through errors.As: %v", res.Err)
	}
}

func TestSendThatIsNotSentIsAnError(t *testing.T) {
	t.Parallel()
	srv := newStub(t, 200, `{}`)
	c := client(t, srv.URL, time.Second)
	done, cancel := context.WithCancel(context.Background())
	cancel()

	for _, tt := range []struct {
		name string
		ctx  context.Context
		call external.Call
		want error
	}{
		{"empty key", context.Background(), external.Call{Path: "/x"}, external.ErrInvalidRequest},
		{"key with a space", context.Background(), external.Call{Path: "/x", Key: "a b"}, external.ErrInvalidRequest},
		{"key too long", context.Background(), external.Call{Path: "/x", Key: strings.Repeat("k", 256)}, external.ErrInvalidRequest},
		{"body that is not JSON", context.Background(), external.Call{Path: "/x", Key: "k", Body: func() {}}, external.ErrInvalidRequest},
		{"context already done", done, call, context.Canceled},
		{"deadline already passed", context.Background(),
			external.Call{Path: "/x", Key: "k", Deadline: time.Now().Add(-time.Millisecond)}, external.ErrDeadlinePassed},
	} {
		if _, err := c.Send(tt.ctx, tt.call); !errors.Is(err, tt.want) {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.want)
		}
	}
	if n := srv.hits.Load(); n != 0 {
		t.Fatalf("the system received %d requests, want none", n)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		body   string
		want   external.Truth // "" means ErrUnreachable
	}{
		{"200 carries the truth", 200, `{"status":"RUNNING"}`, external.TruthRunning},
		{"200 COMPLETED", 200, `{"status":"COMPLETED"}`, external.TruthCompleted},
		{"200 REJECTED", 200, `{"status":"REJECTED"}`, external.TruthRejected},
		{"404 saying NOT_STARTED", 404, `{"key":"op-1","status":"NOT_STARTED"}`, external.TruthNotStarted},
		{"a bare 404 is no information", 404, `404 page not found`, ""},
		{"200 saying NOT_STARTED contradicts itself", 200, `{"status":"NOT_STARTED"}`, ""},
		{"200 with no truth is no information", 200, `{}`, ""},
		{"200 with an invented truth", 200, `{"status":"MAYBE"}`, ""},
		{"503", 503, `{"error":"unavailable"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newStub(t, tt.status, tt.body)
			got, err := client(t, srv.URL, time.Second).Status(context.Background(), "/v1/things", "op-1")
			if tt.want == "" {
				if !errors.Is(err, external.ErrUnreachable) {
					t.Fatalf("status = %q, %v; want ErrUnreachable", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("status = %q, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestStatusWithNobodyListeningIsUnreachable(t *testing.T) {
	t.Parallel()
	c := client(t, "http://"+closedAddr(t), time.Second)
	if _, err := c.Status(context.Background(), "/v1/things", "op-1"); !errors.Is(err, external.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
}

func TestConnectionsAreReused(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"status":"COMPLETED"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := client(t, srv.URL, time.Second)
	for range 5 {
		if res, _ := c.Send(context.Background(), call); res.Outcome != external.Confirmed {
			t.Fatalf("result = %+v", res)
		}
	}
	// Bodies are read to the end and closed, so one connection serves all.
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 sequential calls, want 1", n)
	}
}

func TestDeadlineFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 6, 1, 14, 0, 2, 345_999_999, time.FixedZone("CEST", 2*3600))
	if got, want := external.FormatDeadline(at), "2025-06-01T12:00:02.345Z"; got != want {
		t.Fatalf("FormatDeadline = %q, want %q (UTC, truncated to the millisecond)", got, want)
	}
	for _, s := range []string{"2025-06-01T12:00:02.345Z", "2025-06-01T14:00:02.345+02:00", "2025-06-01T12:00:02Z"} {
		if _, err := external.ParseDeadline(s); err != nil {
			t.Errorf("ParseDeadline(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "tomorrow", "2025-06-01 12:00:02", "1717243202"} {
		if _, err := external.ParseDeadline(s); err == nil {
			t.Errorf("ParseDeadline(%q) accepted it", s)
		}
	}
}

// closedAddr returns an address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
