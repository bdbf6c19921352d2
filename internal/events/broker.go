package events

import (
	"sync"
	"time"
)

// BrokerState is what this process knows of its broker: answering, or away
// since when and why. The runtime that connects the relay sets it; the
// admin pages read it to tell a broker that is away — the outbox keeps
// every event until it answers — from a promise broken while it answers
// (an event published and then lost).
type BrokerState struct {
	mu    sync.Mutex
	name  string // "NATS"
	addr  string // where it is asked: "nats://127.0.0.1:4222"
	away  bool
	since time.Time
	why   string
}

// NewBrokerState is the state of the broker name at addr, away until it
// first answers (the relay has not reached it yet).
func NewBrokerState(name, addr string) *BrokerState {
	return &BrokerState{name: name, addr: addr, away: true, since: time.Now(), why: "not reached yet"}
}

// Away records that the broker does not answer; err says why (nil: no
// reason given). The first of a run of Away calls fixes since.
func (b *BrokerState) Away(err error) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.away {
		b.away, b.since = true, time.Now()
	}
	b.why = "no reason given"
	if err != nil {
		b.why = err.Error()
	}
}

// Answering records that the broker answers again.
func (b *BrokerState) Answering() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.away, b.since, b.why = false, time.Now(), ""
}

// BrokerStatus is a BrokerState read at one moment.
type BrokerStatus struct {
	Name, Addr string
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
	return BrokerStatus{Name: b.name, Addr: b.addr, Away: b.away, Since: b.since, Why: b.why}
}
