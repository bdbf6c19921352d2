// Package netfault is a small TCP proxy that puts the network's faults
// between two processes on command: it delays bytes, holds a request in
// flight past its sender's patience, and cuts connections.
//
// It exists because a request that is slow in the network is a different
// fault from a server that is slow. A call held on its way is still
// delivered after its caller gave up: the caller saw a timeout, asked the
// server what happened ("not started" — the call has not arrived yet), and
// then the original arrives and takes effect. No fault a server can stage
// in its own handler produces that order of events; a proxy in the path
// does.
//
// The proxy knows nothing of HTTP. It only sees two byte streams per
// connection and one rule of thumb about them: bytes from the client after
// bytes from the server (or the first bytes of a connection) begin a new
// request. That is exact for HTTP/1.1 without pipelining, which is what the
// app's clients speak, and it is all HoldNext needs to hold "the next
// request" on a kept-alive connection as well as on a new one.
//
// What the proxy promises, so tests can rely on it:
//
//   - Order: the bytes of one direction arrive in the order they were sent,
//     each chunk no earlier than the delay in force when it was read.
//   - A client that leaves does not take its request back: bytes it sent
//     are still delivered, and the server's side stays open until the server
//     has answered (the answer goes nowhere), closed, or Options.Linger has
//     passed; only then is the client's close passed on.
//   - Cut closes every open connection at once, with a reset.
package netfault

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a proxy.
type Options struct {
	// Addr is where the proxy listens. Default "127.0.0.1:0" (a free port).
	Addr string
	// Linger bounds how long the server's side of a connection stays open
	// after its client left with a request unanswered. Default 30 s.
	Linger time.Duration
	// DialTimeout bounds connecting to the target. Default 5 s.
	DialTimeout time.Duration
}

// Proxy forwards every connection it accepts to one target address.
type Proxy struct {
	target string
	opts   Options
	ln     net.Listener

	mu    sync.Mutex
	up    time.Duration // the standing delay, client → server
	down  time.Duration // the standing delay, server → client
	holds []hold        // HoldNext rules, oldest first
	conns map[*conn]struct{}

	stats struct {
		conns, requests, held, cut atomic.Int64
	}
	wg     sync.WaitGroup
	closed atomic.Bool
}

// hold is one HoldNext rule: the next n requests containing match are held d.
type hold struct {
	n     int
	d     time.Duration
	match string
}

// Stats count what went through the proxy since it started.
type Stats struct {
	Conns    int64 // connections accepted
	Requests int64 // requests seen (see the package comment for what a request is)
	Held     int64 // requests HoldNext held
	Cut      int64 // connections Cut closed
}

// Listen starts a proxy to target ("host:port").
func Listen(target string, opts Options) (*Proxy, error) {
	opts.Addr = cmp.Or(opts.Addr, "127.0.0.1:0")
	opts.Linger = cmp.Or(opts.Linger, 30*time.Second)
	opts.DialTimeout = cmp.Or(opts.DialTimeout, 5*time.Second)
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("netfault: listen %s: %w", opts.Addr, err)
	}
	p := &Proxy{target: target, opts: opts, ln: ln, conns: map[*conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address ("127.0.0.1:port"); URL the same as http://.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }
func (p *Proxy) URL() string  { return "http://" + p.Addr() }

// SetDelay sets the standing delay of each direction, for bytes read from
// now on (bytes already on their way keep the delay they were read with).
// Zero and zero is plain pass-through.
func (p *Proxy) SetDelay(up, down time.Duration) {
	p.mu.Lock()
	p.up, p.down = up, down
	p.mu.Unlock()
}

// Delay returns the standing delays.
func (p *Proxy) Delay() (up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up, p.down
}

// HoldNext holds the client's bytes of the next n requests whose first
// bytes contain match ("" matches any) for d before forwarding them, on
// top of the standing delay. Rules queue up; each request is held by at
// most one rule, the oldest that matches.
func (p *Proxy) HoldNext(n int, d time.Duration, match string) {
	if n <= 0 {
		return
	}
	p.mu.Lock()
	p.holds = append(p.holds, hold{n: n, d: d, match: match})
	p.mu.Unlock()
}

// Heal removes every standing delay and pending hold; Cut is not undone
// (the connections are gone) and bytes already held stay held.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.up, p.down, p.holds = 0, 0, nil
	p.mu.Unlock()
}

// Cut closes every open connection now, both sides, with a reset. It
// returns how many it cut. New connections are accepted as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	victims := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.reset()
	}
	p.stats.cut.Add(int64(len(victims)))
	return len(victims)
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Conns:    p.stats.conns.Load(),
		Requests: p.stats.requests.Load(),
		Held:     p.stats.held.Load(),
		Cut:      p.stats.cut.Load(),
	}
}

// Close stops listening, cuts every connection and waits for them to end.
func (p *Proxy) Close() error {
	p.closed.Store(true)
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if p.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		p.stats.conns.Add(1)
		p.wg.Add(1)
		go p.serve(client.(*net.TCPConn))
	}
}

// serve connects to the target and runs the two directions of one
// connection until both are done.
func (p *Proxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.target, p.opts.DialTimeout)
	if err != nil {
		// The target is down: the client sees its connection closed, as
		// it would through a real middlebox that cannot reach the server.
		client.SetLinger(0)
		client.Close()
		return
	}
	c := newConn(p, client, s.(*net.TCPConn))
	p.mu.Lock()
	if p.closed.Load() {
		p.mu.Unlock()
		c.reset()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	c.run()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// delayFor is the delay for a chunk read now in one direction; for a chunk
// that begins a request it also applies the oldest matching hold.
func (p *Proxy) delayFor(upstream, begins bool, first []byte) (d time.Duration, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !upstream {
		return p.down, false
	}
	d = p.up
	if !begins {
		return d, false
	}
	p.stats.requests.Add(1)
	for i := range p.holds {
		h := &p.holds[i]
		if h.match == "" || strings.Contains(string(first), h.match) {
			d += h.d
			if h.n--; h.n == 0 {
				p.holds = append(p.holds[:i], p.holds[i+1:]...)
			}
			p.stats.held.Add(1)
			return d, true
		}
	}
	return d, false
}
