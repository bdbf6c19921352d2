package netfault

import (
	"sync"
	"sync/atomic"
	"time"
)

// conn is one proxied connection: two pipes, client → server ("up") and
// server → client ("down"), each a reader that stamps every chunk with the
// moment it may be delivered and a writer that delivers it then.
type conn struct {
	p              *Proxy
	client, server tcpConn

	// lastUp is true while the latest bytes read came from the client:
	// the next client chunk after server bytes begins a new request.
	lastUp atomic.Bool
	// heldReq is true while the current request is held: its later
	// chunks keep the hold, so a request is never split around it.
	heldReq  bool
	holdTill time.Time

	// downChunks counts chunks read from the server; answered wakes a
	// writer waiting for the server to answer a client that left.
	downChunks atomic.Int64
	answered   chan struct{}
	serverGone chan struct{} // closed when the down reader stops

	cut       chan struct{} // closed by reset: sleeping writers stop
	resetOnce sync.Once
}

// tcpConn is what the pipes need of a *net.TCPConn.
type tcpConn interface {
	Read([]byte) (int, error)
	Write([]byte) (int, error)
	Close() error
	CloseWrite() error
	SetLinger(int) error
}

// chunk is bytes read from one side, due at the other at a moment.
type chunk struct {
	data []byte
	due  time.Time
}

func newConn(p *Proxy, client, server tcpConn) *conn {
	return &conn{p: p, client: client, server: server,
		answered: make(chan struct{}, 1), serverGone: make(chan struct{}), cut: make(chan struct{})}
}

func (c *conn) run() {
	upQ := make(chan chunk, 256)
	downQ := make(chan chunk, 256)
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); c.read(c.client, upQ, true) }()
	go func() { defer wg.Done(); defer close(c.serverGone); c.read(c.server, downQ, false) }()
	go func() { defer wg.Done(); c.writeUp(upQ) }()
	go func() { defer wg.Done(); c.writeDown(downQ) }()
	wg.Wait()
	c.client.Close()
	c.server.Close()
}

// read stamps each chunk from src with its due time and queues it; the
// queue is closed at EOF or on any error.
func (c *conn) read(src tcpConn, q chan<- chunk, upstream bool) {
	defer close(q)
	var prevDue time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			due := now.Add(c.delay(upstream, buf[:n]))
			// Never overtake an earlier chunk: order is kept.
			if due.Before(prevDue) {
				due = prevDue
			}
			prevDue = due
			q <- chunk{data: append([]byte(nil), buf[:n]...), due: due}
			if !upstream {
				c.downChunks.Add(1)
				select {
				case c.answered <- struct{}{}:
				default:
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// delay decides one chunk's delay and keeps the request bookkeeping. Only
// the reader of each direction calls it, and only the up reader touches
// heldReq, so the fields need no lock of their own.
func (c *conn) delay(upstream bool, data []byte) time.Duration {
	if !upstream {
		c.lastUp.Store(false)
		d, _ := c.p.delayFor(false, false, nil)
		return d
	}
	begins := !c.lastUp.Swap(true)
	d, held := c.p.delayFor(true, begins, data)
	if begins {
		c.heldReq = held
		if held {
			c.holdTill = time.Now().Add(d)
		}
	} else if c.heldReq {
		// The rest of a held request waits for its head.
		if rest := time.Until(c.holdTill); rest > d {
			d = rest
		}
	}
	return d
}

// writeUp delivers the client's bytes to the server. When the client has
// left (its queue closed), a request it sent is still delivered, and the
// server keeps the connection until it answers, closes, or Linger passes;
// then the client's close is passed on as a half-close.
func (c *conn) writeUp(q <-chan chunk) {
	var answersAtDelivery int64
	for ch := range q {
		if !c.sleepUntil(ch.due) {
			return
		}
		answersAtDelivery = c.downChunks.Load()
		if _, err := c.server.Write(ch.data); err != nil {
			c.reset()
			return
		}
	}
	// The client is gone or half-closed. An unanswered request stays open
	// at the server: its answer will go nowhere, but it is processed.
	if c.lastUp.Load() {
		linger := time.NewTimer(c.p.opts.Linger)
		defer linger.Stop()
		for c.downChunks.Load() == answersAtDelivery {
			select {
			case <-c.answered:
			case <-c.serverGone:
				return
			case <-c.cut:
				return
			case <-linger.C:
				c.server.CloseWrite()
				return
			}
		}
	}
	c.server.CloseWrite()
}

// writeDown delivers the server's bytes to the client, and closes the
// client's side when the server has finished.
func (c *conn) writeDown(q <-chan chunk) {
	clientGone := false
	for ch := range q {
		if clientGone {
			continue // the answer to a client that left goes nowhere
		}
		if !c.sleepUntil(ch.due) {
			return
		}
		if _, err := c.client.Write(ch.data); err != nil {
			clientGone = true
		}
	}
	c.client.CloseWrite()
	// The server has closed; nothing the client still sends can be
	// delivered. Close the client side so the up reader stops.
	c.client.Close()
}

// reset closes both sides at once with a reset (Cut, Close, a failed write).
func (c *conn) reset() {
	c.resetOnce.Do(func() {
		close(c.cut)
		c.client.SetLinger(0)
		c.server.SetLinger(0)
		c.client.Close()
		c.server.Close()
	})
}

// sleepUntil waits until t; false when the connection was reset meanwhile.
func (c *conn) sleepUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-c.cut:
		return false
	}
}
