package events_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/testdb"
)

// outbox is the tests' event writer, shared as a process shares one.
var outbox = events.NewWriter(nil)

type bundle struct {
	db       *testdb.DB
	nc       *nats.Conn
	nats     *events.NATS
	natsCfg  events.NATSConfig
	kafka    *events.Kafka
	kafkaCfg events.KafkaConfig
	// tasks: the fake task queue and the push handlers' front (tasks_test.go)
	tasks *tasksSide
	// pub is what the bundle's relay publishes through (nats, kafka or tasks)
	pub      events.Publisher
	injector *events.Injector
	userID   int64
	// transport the bundle's events travel on
	transport string
}

func uniqueName(prefix string) string {
	b := make([]byte, 5)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// setupNATS returns a fresh database and a JetStream stream of the test's
// own on the server at url (testenv.NATSURL: every test names its own
// stream and subjects, so tests of several packages can share one server).
func setupNATS(t testing.TB, url string, cfg events.NATSConfig) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{db: testdb.New(t), transport: events.TransportNATS}
	b.injector = events.NewInjector(b.db.Pool)
	b.userID = demoUser(t, b.db)
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("nats at %s: %v (is nats-server -js running?)", url, err)
	}
	t.Cleanup(nc.Close)
	b.nc = nc
	name := uniqueName("t")
	cfg.Stream = "IDEMLAB_TEST_" + name
	cfg.Subject = "idemlab_test." + name
	b.natsCfg = cfg
	b.nats, err = events.NewNATS(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.pub = b.nats
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b.nats.DeleteStream(ctx)
	})
	return b
}

func demoUser(t testing.TB, db *testdb.DB) int64 {
	t.Helper()
	var id int64
	err := db.Pool.QueryRow(context.Background(), `
		INSERT INTO users (name, api_token_sha256)
		VALUES ('events-test', sha256('events-test'))
		RETURNING id`).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// write commits n policy.cancelled events and returns their ids.
func (b *bundle) write(t testing.TB, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, 0, n)
	for i := range n {
		err := pgx.BeginFunc(context.Background(), b.db.Pool, func(tx pgx.Tx) error {
			id, err := outbox.Write(context.Background(), tx, events.NewPolicyCancelled(events.PolicyCancelled{
				PolicyID: int64(i + 1), PolicyNumber: fmt.Sprintf("P-%d", i+1), UserID: b.userID,
				OperationID: int64(100 + i), RefundKey: fmt.Sprintf("%d:refund", 100+i), RefundAmount: "10.50",
				CancelledAt: time.Now(),
			}))
			ids = append(ids, id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func (b *bundle) relay(t testing.TB, cfg events.RelayConfig) *events.Relay {
	t.Helper()
	cfg.Injector = b.injector
	if cfg.Instance == "" {
		cfg.Instance = "test-relay"
	}
	r, err := events.NewRelay(b.db.Pool, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startConsumers runs `instances` instances of each consumer on the
// bundle's transport (NATS, Kafka or Cloud Tasks) until the test ends.
func (b *bundle) startConsumers(t testing.TB, instances int) {
	t.Helper()
	if b.transport == events.TransportTasks {
		b.startPushHandlers(t, instances, nil)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, c := range []events.Consumer{events.Notifications{}, events.Ledger{}, events.History{}} {
		for i := range instances {
			h := events.NewHandler(b.db.Pool, c, events.HandlerConfig{
				Transport: b.transport, Instance: fmt.Sprintf("instance-%d", i+1)})
			cfg := events.ConsumerConfig{Wait: 200 * time.Millisecond, RetryAfter: 200 * time.Millisecond, Injector: b.injector}
			var run func(context.Context)
			if b.transport == events.TransportKafka {
				run = b.kafka.Consumer(h, cfg).Run
			} else {
				cons, err := b.nats.Consumer(ctx, h, cfg)
				if err != nil {
					t.Fatal(err)
				}
				run = cons.Run
			}
			wg.Add(1)
			go func() { defer wg.Done(); run(ctx) }()
		}
	}
}

// effects counts, per event, the mailbox messages and ledger lines.
type effects struct{ inbox, mailbox, ledger int }

func (b *bundle) effects(t testing.TB, id uuid.UUID) effects {
	t.Helper()
	var e effects
	err := b.db.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM inbox WHERE event_id = $1),
		       (SELECT count(*) FROM mailbox WHERE event_id = $1),
		       (SELECT count(*) FROM ledger_entries WHERE event_id = $1)`, id).Scan(&e.inbox, &e.mailbox, &e.ledger)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitApplied waits until every consumer applied every id, and fails the
// test if any event was applied more than once by a consumer.
func (b *bundle) waitApplied(t testing.TB, ids []uuid.UUID, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var applied int
		err := b.db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM inbox WHERE event_id = ANY($1)`, ids).Scan(&applied)
		if err != nil {
			t.Fatal(err)
		}
		if applied == len(events.Consumers)*len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d of %d (event, consumer) pairs applied", within, applied, len(events.Consumers)*len(ids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.assertOnce(t, ids)
}

// assertOnce: one inbox row per consumer, one mailbox message and one
// ledger line per event.
func (b *bundle) assertOnce(t testing.TB, ids []uuid.UUID) {
	t.Helper()
	for _, id := range ids {
		if e := b.effects(t, id); e != (effects{len(events.Consumers), 1, 1}) {
			t.Errorf("event %s: inbox %d, mailbox %d, ledger %d; want %d, 1, 1", id, e.inbox, e.mailbox, e.ledger, len(events.Consumers))
		}
	}
	r, err := invariants.Check(context.Background(), b.db.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Errorf("invariants after delivery: %+v", r.Violations)
	}
}

// deliveries counts event_deliveries rows of id by outcome.
func (b *bundle) deliveries(t testing.TB, id uuid.UUID) map[string]int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT outcome, count(*) FROM event_deliveries WHERE event_id = $1 GROUP BY outcome`, id)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	var o string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&o, &n}, func() error { m[o] = n; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (b *bundle) outboxStatus(t testing.TB, id uuid.UUID) (status string, attempts int) {
	t.Helper()
	err := b.db.Pool.QueryRow(context.Background(), `SELECT status, attempts FROM outbox WHERE id = $1`, id).Scan(&status, &attempts)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempts
}
