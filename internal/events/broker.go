package events

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BrokerState is what this process knows of its broker: answering, or away
// since when and why. The runtime that connects the relay sets it; the
// admin pages read it to tell a broker that is away — the outbox keeps
// every event until it answers — from a promise broken while it answers
// (an event published and then lost).
type BrokerState struct {
	mu sync.Mutex
	// elsewhere: this process runs no relay (EVENTS_WORKERS=off); another
	// process (web events) delivers the events, and this one cannot tell
	// whether it runs or whether its broker answers.
	elsewhere bool
	name      string // "NATS"
	addr      string // where it is asked: "nats://127.0.0.1:4222"
	away      bool
	since     time.Time
	why       string
}

// NewBrokerState is the state of the broker name at addr, away until it
// first answers (the relay has not reached it yet).
func NewBrokerState(name, addr string) *BrokerState {
	return &BrokerState{name: name, addr: addr, away: true, since: time.Now(), why: "not reached yet"}
}

// NewBrokerElsewhere is the state of a process that runs no relay
// (EVENTS_WORKERS=off): its events are delivered by another process.
func NewBrokerElsewhere() *BrokerState {
	return &BrokerState{elsewhere: true, name: "web events", since: time.Now(), why: "this process runs no relay (EVENTS_WORKERS=off)"}
}

// Away records that the broker does not answer; err says why, in words
// (BrokerCause: the pages never quote a driver's error text; the caller
// logs it). The first of a run of Away calls fixes since.
func (b *BrokerState) Away(err error) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.away {
		b.away, b.since = true, time.Now()
	}
	b.why = BrokerCause(err)
}

// BrokerCause says in words why a broker does not answer, from the error
// its client gave: what a reader of the page can act on, never the error's
// own text (which names Go types and internals, and is in the log).
func BrokerCause(err error) string {
	if err == nil {
		return "no reason given"
	}
	msg := strings.ToLower(err.Error())
	has := func(parts ...string) bool {
		for _, p := range parts {
			if strings.Contains(msg, p) {
				return true
			}
		}
		return false
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED) || has("connection refused"):
		return "nothing listens there: the connection is refused"
	case has("no such host", "server misbehaving"):
		return "its host name does not resolve"
	case errors.Is(err, context.DeadlineExceeded) || has("timeout", "timed out", "i/o timeout"):
		return "it does not answer in time"
	case has("jetstream not enabled", "no responders"):
		return "it answers, but JetStream is not enabled there"
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || has("connection reset", "connection closed", "broken pipe", "eof"):
		return "the connection was closed"
	case has("no servers available"):
		return "no server answers"
	}
	return "its client gave an error (the log has it)"
}

// Answering records that the broker answers again.
func (b *BrokerState) Answering() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.away { // since: when it came back, not the latest ping
		b.since = time.Now()
	}
	b.away, b.why = false, ""
}

// Watch keeps the state true for a transport whose client does not say
// when its broker goes away (Kafka's, the task queue's; NATS's client calls
// back on disconnect and reconnect, runNATS): every interval it pings, and
// records Away or Answering, until ctx is done. So all three transports are
// named away when their broker goes away later, not only while they are set
// up.
func (b *BrokerState) Watch(ctx context.Context, ping func(context.Context) error, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.check(ctx, ping, every)
		}
	}
}

// check pings once, bounded by timeout, and records what it found.
func (b *BrokerState) check(ctx context.Context, ping func(context.Context) error, timeout time.Duration) {
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := ping(pingCtx)
	switch {
	case ctx.Err() != nil: // shutting down: nothing learned
	case err != nil:
		b.Away(err)
	default:
		b.Answering()
	}
}

// BrokerStatus is a BrokerState read at one moment.
type BrokerStatus struct {
	Name, Addr string
	Elsewhere  bool // this process runs no relay (NewBrokerElsewhere)
	Away       bool
	Since      time.Time
	Why        string
}

// Status reads the state; a nil state is a broker that answers (a
// transport without one of its own: River's is PostgreSQL).
func (b *BrokerState) Status() BrokerStatus {
	if b == nil {
		return BrokerStatus{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return BrokerStatus{Name: b.name, Addr: b.addr, Elsewhere: b.elsewhere, Away: b.away || b.elsewhere, Since: b.since, Why: b.why}
}
