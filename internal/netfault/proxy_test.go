package netfault_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/netfault"
)

// ledger is a server that records when each request arrived, like a fake
// that writes what it received.
type ledger struct {
	mu      sync.Mutex
	arrived map[string]time.Time
	srv     *httptest.Server
	block   chan struct{} // /block waits on it
	gone    chan string   // /block reports why it ended
}

func newLedger(t *testing.T) *ledger {
	l := &ledger{arrived: map[string]time.Time{}, block: make(chan struct{}), gone: make(chan string, 10)}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/block":
			select {
			case <-l.block:
				l.gone <- "released"
			case <-r.Context().Done():
				l.gone <- "caller left"
			}
			return
		case "/status":
			l.mu.Lock()
			_, ok := l.arrived[r.URL.Query().Get("key")]
			l.mu.Unlock()
			fmt.Fprint(w, map[bool]string{true: "COMPLETED", false: "NOT_STARTED"}[ok])
			return
		}
		l.mu.Lock()
		l.arrived[r.URL.Query().Get("key")] = time.Now()
		l.mu.Unlock()
		io.WriteString(w, "applied")
	}))
	t.Cleanup(func() { l.srv.Close() })
	t.Cleanup(func() { close(l.block) })
	return l
}

func (l *ledger) arrival(key string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.arrived[key]
	return at, ok
}

func proxyTo(t *testing.T, target string, opts netfault.Options) *netfault.Proxy {
	t.Helper()
	p, err := netfault.Listen(target, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func get(t *testing.T, c *http.Client, url string) (string, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// keptAlive is one connection carrying request after request, as a client
// that keeps its connections alive does — written by hand: net/http's
// client dials anew when it has not seen the previous request's write
// finish within 50 ms, and under -race on a loaded machine it did (2
// connections for 4 requests), which is a client's choice, not the proxy's.
type keptAlive struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialKeptAlive(t *testing.T, p *netfault.Proxy) *keptAlive {
	t.Helper()
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &keptAlive{conn: conn, r: bufio.NewReader(conn)}
}

// get sends GET path on the connection and reads the answer's body.
func (k *keptAlive) get(path string) (string, error) {
	k.conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(k.conn, "GET %s HTTP/1.1\r\nHost: ledger\r\n\r\n", path); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestPassThroughKeepsConnectionsAlive(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{})
	c := dialKeptAlive(t, p)
	for i := range 5 {
		body, err := c.get(fmt.Sprintf("/cancel?key=k%d", i))
		if err != nil || body != "applied" {
			t.Fatalf("request %d: %q %v", i, body, err)
		}
	}
	if s := p.Stats(); s.Conns != 1 || s.Requests != 5 || s.Held != 0 {
		t.Fatalf("stats %+v, want one kept-alive connection carrying 5 requests", s)
	}
}

// The fault of issue 11 item 1: a call held in the network past its
// caller's timeout. The caller gives up, asks for the status (not started:
// the call has not arrived), and the original arrives afterwards anyway.
func TestAHeldRequestArrivesAfterItsCallerGaveUp(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{})
	const held = 1500 * time.Millisecond
	p.HoldNext(1, held, "POST ")

	impatient := &http.Client{Timeout: 200 * time.Millisecond}
	sent := time.Now()
	_, err := impatient.Post(p.URL()+"/cancel?key=A", "text/plain", nil)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the held call answered (%v); want the caller's timeout", err)
	}
	status, err := get(t, &http.Client{Timeout: 5 * time.Second}, p.URL()+"/status?key=A")
	if err != nil || status != "NOT_STARTED" {
		t.Fatalf("status while the call is held: %q %v, want NOT_STARTED", status, err)
	}

	deadline := time.Now().Add(10 * time.Second)
	for {
		if at, ok := l.arrival("A"); ok {
			if at.Sub(sent) < held {
				t.Fatalf("arrived %s after sending, want at least the hold %s", at.Sub(sent), held)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held call never arrived: a caller's timeout took it back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := p.Stats(); s.Held != 1 {
		t.Fatalf("stats %+v, want one held request", s)
	}
}

// A hold applies to the next request even on a connection that is already
// open (the app's clients keep connections alive), and only to requests
// that match.
func TestHoldNextCatchesARequestOnAKeptAliveConnection(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{})
	c := dialKeptAlive(t, p)
	if _, err := c.get("/status?key=x"); err != nil {
		t.Fatal(err)
	}
	const held = 800 * time.Millisecond
	p.HoldNext(1, held, "GET /cancel")

	start := time.Now()
	if _, err := c.get("/status?key=x"); err != nil { // does not match
		t.Fatal(err)
	}
	if d := time.Since(start); d >= held {
		t.Fatalf("a request the rule does not match waited %s", d)
	}
	start = time.Now()
	if _, err := c.get("/cancel?key=B"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < held {
		t.Fatalf("the matching request took %s, want at least the hold %s", d, held)
	}
	start = time.Now()
	if _, err := c.get("/cancel?key=C"); err != nil { // the rule is used up
		t.Fatal(err)
	}
	if d := time.Since(start); d >= held {
		t.Fatalf("a request after the rule was used up waited %s", d)
	}
	if s := p.Stats(); s.Conns != 1 || s.Held != 1 || s.Requests != 4 {
		t.Fatalf("stats %+v, want 1 connection, 4 requests, 1 held", s)
	}
}

func TestDelayEachDirection(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{})
	c := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct{ up, down time.Duration }{
		{400 * time.Millisecond, 0},
		{0, 400 * time.Millisecond},
		{300 * time.Millisecond, 300 * time.Millisecond},
	} {
		p.SetDelay(tc.up, tc.down)
		if up, down := p.Delay(); up != tc.up || down != tc.down {
			t.Fatalf("Delay() = %s, %s", up, down)
		}
		start := time.Now()
		if _, err := get(t, c, p.URL()+"/status?key=x"); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < tc.up+tc.down {
			t.Fatalf("up %s down %s: the round trip took %s", tc.up, tc.down, d)
		}
	}
	p.Heal()
	if up, down := p.Delay(); up != 0 || down != 0 {
		t.Fatalf("after Heal the delay is %s, %s", up, down)
	}
}

// Bytes read while a long delay is in force are not overtaken by bytes
// read after the delay was lifted.
func TestADelayChangeNeverReordersBytes(t *testing.T) {
	t.Parallel()
	echo := echoServer(t)
	p := proxyTo(t, echo, netfault.Options{})
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p.SetDelay(500*time.Millisecond, 0)
	io.WriteString(conn, "first\n")
	time.Sleep(50 * time.Millisecond) // "first" is read (and stamped) before the change
	p.SetDelay(0, 0)
	io.WriteString(conn, "second\n")
	r := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for _, want := range []string{"first\n", "second\n"} {
		got, err := r.ReadString('\n')
		if err != nil || got != want {
			t.Fatalf("read %q (%v), want %q", got, err, want)
		}
	}
}

func TestCutClosesEveryOpenConnection(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{Linger: 100 * time.Millisecond})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := get(t, &http.Client{Timeout: 20 * time.Second}, p.URL()+"/block")
			errs <- err
		}()
	}
	waitFor(t, func() bool { return p.Stats().Requests == 2 })
	time.Sleep(50 * time.Millisecond) // the server has both requests
	if n := p.Cut(); n != 2 {
		t.Fatalf("Cut cut %d connections, want 2", n)
	}
	for range 2 {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a cut request answered")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a cut request is still waiting")
		}
	}
	for range 2 {
		if why := <-l.gone; why != "caller left" {
			t.Fatalf("the server saw %q, want the connection gone", why)
		}
	}
	if body, err := get(t, &http.Client{Timeout: 5 * time.Second}, p.URL()+"/status?key=x"); err != nil || body == "" {
		t.Fatalf("after a cut, a new request: %q %v", body, err)
	}
	if s := p.Stats(); s.Cut != 2 {
		t.Fatalf("stats %+v, want 2 cut", s)
	}
}

// A client that leaves with its request unanswered keeps the server's side
// open for Linger, no longer.
func TestTheServerSideLingersAfterItsClientLeft(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	const linger = 700 * time.Millisecond
	p := proxyTo(t, l.srv.Listener.Addr().String(), netfault.Options{Linger: linger})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/block", nil)
	go http.DefaultClient.Do(req)
	waitFor(t, func() bool { return p.Stats().Requests == 1 })
	time.Sleep(50 * time.Millisecond)
	left := time.Now()
	cancel()
	select {
	case why := <-l.gone:
		if why != "caller left" {
			t.Fatalf("server: %s", why)
		}
		if d := time.Since(left); d < linger {
			t.Fatalf("the server saw its caller leave %s after it left, before the linger %s", d, linger)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server side stayed open past its linger")
	}
}

func TestATargetThatIsDownClosesTheClient(t *testing.T) {
	t.Parallel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	p := proxyTo(t, addr, netfault.Options{})
	if _, err := get(t, &http.Client{Timeout: 5 * time.Second}, p.URL()+"/"); err == nil {
		t.Fatal("a request through a proxy to nothing answered")
	}
}

func TestCloseDoesNotWaitForHeldBytes(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	p, err := netfault.Listen(l.srv.Listener.Addr().String(), netfault.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p.HoldNext(1, time.Minute, "")
	go get(t, &http.Client{Timeout: 2 * time.Minute}, p.URL()+"/cancel?key=Z")
	waitFor(t, func() bool { return p.Stats().Held == 1 })
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for bytes held for a minute")
	}
	if _, ok := l.arrival("Z"); ok {
		t.Fatal("bytes held when the proxy closed were delivered")
	}
}

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
