package events_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/events"
)

// privateNATS is an embedded NATS server of the test's own, on a free port,
// so the test can stop and start it (same port, same store) without
// touching the shared one.
type privateNATS struct {
	t     testing.TB
	port  int
	store string
	srv   *events.NATSServer
}

func startPrivateNATS(t testing.TB) *privateNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &privateNATS{t: t, port: port, store: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *privateNATS) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

func (s *privateNATS) start() {
	s.t.Helper()
	srv, err := events.StartNATSServer(events.NATSServerConfig{Addr: fmt.Sprintf("127.0.0.1:%d", s.port), DataDir: s.store})
	if err != nil {
		s.t.Fatal(err)
	}
	s.srv = srv
}

func (s *privateNATS) stop() {
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

// NATS goes away with events waiting: the relay's publishes fail, the rows
// stay PENDING (attempts counted, backoff), nothing is lost; NATS comes
// back (same store) and the relay resumes on its own.
func TestNATSDownAndBackNothingLost(t *testing.T) {
	t.Parallel()
	srv := startPrivateNATS(t)
	b := setupNATS(t, srv.url(), events.NATSConfig{PublishTimeout: 500 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay := b.relay(t, events.RelayConfig{Interval: 100 * time.Millisecond, Backoff: 100 * time.Millisecond,
		MaxBackoff: 300 * time.Millisecond, MaxAttempts: 1000})
	done := make(chan struct{})
	go func() { defer close(done); relay.Run(ctx) }()
	defer func() { cancel(); <-done }()

	before := b.write(t, 5)
	waitFor(t, 10*time.Second, "the first events to be SENT", func() bool {
		for _, id := range before {
			if st, _ := b.outboxStatus(t, id); st != "SENT" {
				return false
			}
		}
		return true
	})

	srv.stop()
	during := b.write(t, 5)
	waitFor(t, 10*time.Second, "failed publish attempts while NATS is down", func() bool {
		_, attempts := b.outboxStatus(t, during[0])
		return attempts >= 2
	})
	for _, id := range during {
		if st, _ := b.outboxStatus(t, id); st != "PENDING" {
			t.Fatalf("with NATS down event %s is %s, want PENDING", id, st)
		}
	}

	srv.start()
	b.startConsumers(t, 2)
	b.waitApplied(t, append(before, during...), 30*time.Second)
}

// A row that fails to publish MaxAttempts times is DEAD; the relay leaves
// it alone; a replay makes it PENDING again and it is delivered.
func TestDeadLetterAndReplay(t *testing.T) {
	t.Parallel()
	srv := startPrivateNATS(t)
	b := setupNATS(t, srv.url(), events.NATSConfig{PublishTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	relay := b.relay(t, events.RelayConfig{MaxAttempts: 2, Backoff: time.Millisecond, MaxBackoff: time.Millisecond})

	srv.stop()
	id := b.write(t, 1)[0]
	for range 2 {
		time.Sleep(10 * time.Millisecond) // past the 1 ms backoff
		relay.RunOnce(ctx)
	}
	if st, attempts := b.outboxStatus(t, id); st != "DEAD" || attempts != 2 {
		t.Fatalf("after 2 failed publishes: %s after %d attempts, want DEAD after 2", st, attempts)
	}
	srv.start()
	if c, err := relay.RunOnce(ctx); err != nil || c.Claimed != 0 {
		t.Fatalf("the relay claimed %d rows (%v), want the dead one left alone", c.Claimed, err)
	}
	if err := events.Replay(ctx, b.db.Pool, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the replayed event to be published", func() bool {
		relay.RunOnce(ctx)
		st, _ := b.outboxStatus(t, id)
		return st == "SENT"
	})
	b.startConsumers(t, 1)
	b.waitApplied(t, ids(id), 20*time.Second)
}
