package provider_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/provider"
)

// The fake provider's tests (internal/provider/fake) run this client against
// every fault mode. These tests cover what the fake never says: odd statuses,
// bodies that make no sense, a provider that is not there at all.

// stub serves one fixed answer and counts the requests it receives.
func stub(t *testing.T, status int, body string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

var req = provider.CancelRequest{Key: "op-1", PolicyID: 7, Reason: "customer asked"}

func TestCancelClassifiesByStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		status  int
		body    string
		outcome provider.Outcome
		truth   provider.Truth
		reason  string
	}{
		{"200 is confirmed", 200, `{"status":"COMPLETED"}`, provider.Confirmed, provider.TruthCompleted, ""},
		{"200 is confirmed whatever the body", 200, `not json`, provider.Confirmed, provider.TruthCompleted, ""},
		{"422 is rejected, with the reason", 422, `{"status":"REJECTED","reason":"already lapsed"}`, provider.Rejected, provider.TruthRejected, "already lapsed"},
		{"202 is unknown: still running", 202, `{"status":"RUNNING"}`, provider.Unknown, provider.TruthRunning, ""},
		{"503 is unknown", 503, `{"error":"unavailable"}`, provider.Unknown, "", ""},
		{"500 is unknown", 500, ``, provider.Unknown, "", ""},
		{"409 is unknown", 409, `{"error":"key_reused"}`, provider.Unknown, "", ""},
		{"404 is unknown", 404, `<html>`, provider.Unknown, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := stub(t, tt.status, tt.body)
			c := provider.NewHTTPClient(srv.URL, time.Second)
			defer c.CloseIdleConnections()
			res, err := c.Cancel(context.Background(), req)
			if err != nil {
				t.Fatalf("err = %v: a sent request is classified, not an error", err)
			}
			if res.Outcome != tt.outcome || res.Truth != tt.truth || res.Reason != tt.reason {
				t.Fatalf("result = %+v, want %s, truth %q, reason %q", res, tt.outcome, tt.truth, tt.reason)
			}
			if (res.Outcome == provider.Unknown) != (res.Err != nil) {
				t.Fatalf("Err = %v: set exactly when the outcome is unknown", res.Err)
			}
			var se *provider.StatusError
			if res.Outcome == provider.Unknown && res.Truth == "" && (!errors.As(res.Err, &se) || se.StatusCode != tt.status) {
				t.Fatalf("cause = %v, want a StatusError %d", res.Err, tt.status)
			}
		})
	}
}

func TestCancelWithNobodyListeningIsUnknown(t *testing.T) {
	t.Parallel()
	c := provider.NewHTTPClient("http://"+closedAddr(t), time.Second)
	res, err := c.Cancel(context.Background(), req)
	if err != nil || res.Outcome != provider.Unknown || res.Err == nil {
		t.Fatalf("result = %+v, %v; want Unknown with the connection error", res, err)
	}
}

func TestCancelThatIsNotSentIsAnError(t *testing.T) {
	t.Parallel()
	srv, hits := stub(t, 200, `{}`)
	c := provider.NewHTTPClient(srv.URL, time.Second)
	done, cancel := context.WithCancel(context.Background())
	cancel()

	for _, tt := range []struct {
		name string
		ctx  context.Context
		req  provider.CancelRequest
	}{
		{"empty key", context.Background(), provider.CancelRequest{PolicyID: 1}},
		{"key with a space", context.Background(), provider.CancelRequest{Key: "a b", PolicyID: 1}},
		{"no policy", context.Background(), provider.CancelRequest{Key: "k"}},
		{"context already done", done, req},
	} {
		if _, err := c.Cancel(tt.ctx, tt.req); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the provider received %d requests, want none", n)
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		body   string
		want   provider.Truth // "" means ErrUnreachable
	}{
		{"200 carries the truth", 200, `{"status":"RUNNING"}`, provider.TruthRunning},
		{"404 saying NOT_STARTED", 404, `{"key":"op-1","status":"NOT_STARTED"}`, provider.TruthNotStarted},
		{"a bare 404 is no information", 404, `404 page not found`, ""},
		{"200 with no truth is no information", 200, `{}`, ""},
		{"200 with an invented truth", 200, `{"status":"MAYBE"}`, ""},
		{"503", 503, `{"error":"unavailable"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := stub(t, tt.status, tt.body)
			c := provider.NewHTTPClient(srv.URL, time.Second)
			defer c.CloseIdleConnections()
			got, err := c.Status(context.Background(), "op-1")
			if tt.want == "" {
				if !errors.Is(err, provider.ErrUnreachable) {
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
	c := provider.NewHTTPClient("http://"+closedAddr(t), time.Second)
	if _, err := c.Status(context.Background(), "op-1"); !errors.Is(err, provider.ErrUnreachable) {
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
	c := provider.NewHTTPClient(srv.URL, time.Second)
	defer c.CloseIdleConnections()
	for range 5 {
		if res, _ := c.Cancel(context.Background(), req); res.Outcome != provider.Confirmed {
			t.Fatalf("result = %+v", res)
		}
	}
	// Bodies are read to the end and closed, so one connection serves all.
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 5 sequential calls, want 1", n)
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

func TestCancelCarriesTheCallersDeadline(t *testing.T) {
	t.Parallel()
	var got atomic.Pointer[http.Request]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Clone(context.Background()))
		w.Write([]byte(`{"status":"COMPLETED"}`))
	}))
	defer srv.Close()
	c := provider.NewHTTPClient(srv.URL, time.Second)
	defer c.CloseIdleConnections()

	deadline := c.Deadline() // recorded by the caller first, then sent
	res, err := c.Cancel(context.Background(), provider.CancelRequest{Key: "op-1:provider_cancel", PolicyID: 7, Deadline: deadline})
	if err != nil || res.Outcome != provider.Confirmed {
		t.Fatalf("result = %+v, %v", res, err)
	}
	r := got.Load()
	if r.URL.Path != "/v1/cancellations" || r.Header.Get("Idempotency-Key") != "op-1:provider_cancel" {
		t.Fatalf("sent %s with key %q", r.URL.Path, r.Header.Get("Idempotency-Key"))
	}
	if h := r.Header.Get("Request-Deadline"); h != deadline.UTC().Format("2006-01-02T15:04:05.000Z") || !res.Deadline.Equal(deadline) {
		t.Fatalf("Request-Deadline = %q, Result.Deadline = %s; want the caller's %s", h, res.Deadline, deadline)
	}
	if _, err := c.Cancel(context.Background(), provider.CancelRequest{Key: "k", PolicyID: 7, Deadline: time.Now().Add(-time.Second)}); !errors.Is(err, provider.ErrDeadlinePassed) {
		t.Fatalf("a call past its deadline: err = %v, want ErrDeadlinePassed (not sent)", err)
	}
}
