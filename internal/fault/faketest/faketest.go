// Package faketest serves a fake over real HTTP for tests and watches it:
// how many handlers are running and how many connections are open, so a
// test can wait for a fake to settle and prove a timed-out call left
// nothing behind.
package faketest

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// Server is one fake's handler on a loopback listener.
type Server struct {
	*httptest.Server
	inflight  atomic.Int64 // handlers running right now
	openConns atomic.Int64 // server-side connections not yet closed
}

// Serve starts h; the server closes when the test ends.
func Serve(t testing.TB, h http.Handler) *Server {
	t.Helper()
	s := &Server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inflight.Add(1)
		defer s.inflight.Add(-1) // runs on abort too: the handler has returned
		h.ServeHTTP(w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.openConns.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.openConns.Add(-1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// WaitHandlers waits (up to 5 s) until no handler runs: a fake finishes what
// it received after its caller gave up, and a test reading its truth must
// not race that commit.
func (s *Server) WaitHandlers(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.inflight.Load() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers still running after 5 s", s.inflight.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// AssertSettled fails unless every handler has returned and every
// connection has closed within a second. closeIdle closes the clients' idle
// keep-alive connections first: they are a pool, not a leak.
func (s *Server) AssertSettled(t testing.TB, closeIdle ...func()) {
	t.Helper()
	for _, f := range closeIdle {
		f()
	}
	deadline := time.Now().Add(time.Second)
	for s.inflight.Load() != 0 || s.openConns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("leak: %d handlers still running, %d connections still open", s.inflight.Load(), s.openConns.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
