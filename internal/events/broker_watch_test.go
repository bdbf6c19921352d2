package events_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/tasks/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// watchUntil watches state with ping until ok holds of its status, or fails.
func watchUntil(t *testing.T, state *events.BrokerState, ok func(events.BrokerStatus) bool, what string) events.BrokerStatus {
	t.Helper()
	var st events.BrokerStatus
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if st = state.Status(); ok(st) {
			return st
		}
	}
	t.Fatalf("the broker was never %s: %+v", what, st)
	return st
}

// Kafka's and the task queue's brokers are named away when they go away
// after the relay was set up, as NATS's are (its client calls back on
// disconnect): before, both were away only while their setup failed, and
// an answering state stayed for good. Watch pings; the cause is in words.
func TestBrokerAwayLaterIsSeenOnKafkaAndTasks(t *testing.T) {
	t.Parallel()
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		broker, err := events.StartKafkaBroker(events.KafkaBrokerConfig{Addr: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		defer broker.Close()
		k, err := events.NewKafka(context.Background(), events.KafkaConfig{Brokers: []string{broker.Addr()}, Topic: uniqueName("idemlab_test.")})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		watched(t, "Kafka", broker.Addr(), k.Ping, broker.Close)
	})
	t.Run("tasks", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		q, err := fake.New(db.Pool, fake.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		api := httptest.NewServer(q.Handler())
		defer api.Close()
		pub, err := events.NewTasks(events.TasksConfig{QueueURL: api.URL, PushURL: "http://127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		watched(t, "The task queue", api.URL, pub.Ping, func() { pub.Close(); api.CloseClientConnections(); api.Close() })
	})
}

// watched: the state answers once ping does, and is away with a cause in
// words after goAway.
func watched(t *testing.T, name, addr string, ping func(context.Context) error, goAway func()) {
	t.Helper()
	state := events.NewBrokerState(name, addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); state.Watch(ctx, ping, 100*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	watchUntil(t, state, func(st events.BrokerStatus) bool { return !st.Away }, "answering")
	goAway()
	st := watchUntil(t, state, func(st events.BrokerStatus) bool { return st.Away }, "away after it went away")
	if st.Why == "" || strings.Contains(st.Why, "dial tcp") || strings.Contains(st.Why, "no reason") {
		t.Errorf("%s away: why %q, want the cause in words", name, st.Why)
	}
}
