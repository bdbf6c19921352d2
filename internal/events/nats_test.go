package events_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/testenv"
)

func TestNATSEveryEventAppliedOncePerConsumer(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{})
	ids := b.write(t, 20)
	relay := b.relay(t, events.RelayConfig{Batch: 8})
	c, err := relay.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Claimed != 20 || c.Published != 20 || c.Duplicates != 0 {
		t.Errorf("relay pass = %+v, want 20 claimed and published, no duplicates", c)
	}
	b.startConsumers(t, 2)
	b.waitApplied(t, ids, 20*time.Second)
	for _, id := range ids {
		if st, _ := b.outboxStatus(t, id); st != "SENT" {
			t.Errorf("event %s is %s, want SENT", id, st)
		}
	}
}

// Ids (and created_at) commit out of order. A relay that remembered "the
// last id I sent" would skip the event that committed second.
func TestRelayPublishesEventsCommittedInReverseOrder(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{})
	ctx := context.Background()
	relay := b.relay(t, events.RelayConfig{})

	first, err := b.db.Pool.Begin(ctx) // writes first, commits last
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	early, err := outbox.Write(ctx, first, events.NewBookingConfirmed(events.BookingChanged{BookingID: 1, UserID: b.userID, At: time.Now()}))
	if err != nil {
		t.Fatal(err)
	}
	late := b.write(t, 1)[0] // written second, committed first

	if c, err := relay.RunOnce(ctx); err != nil || c.Published != 1 {
		t.Fatalf("first pass = %+v, %v; want the one committed event published", c, err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := relay.RunOnce(ctx); err != nil || c.Published != 1 {
		t.Fatalf("second pass = %+v, %v; want the earlier-written event published now", c, err)
	}
	var createdEarly, createdLate time.Time
	b.db.Pool.QueryRow(ctx, `SELECT (SELECT created_at FROM outbox WHERE id = $1), (SELECT created_at FROM outbox WHERE id = $2)`,
		early, late).Scan(&createdEarly, &createdLate)
	if !createdEarly.Before(createdLate) {
		t.Fatalf("test setup: %s was not written before %s", early, late)
	}
	b.startConsumers(t, 1)
	b.waitApplied(t, []uuid.UUID{early, late}, 20*time.Second)
}

// abandonAt arms a switch that panics (crash.Abandon) at p, once.
func abandonAt(t testing.TB, p crash.Point) *crash.Switch {
	t.Helper()
	s := crash.New(events.CrashPoints, slog.New(slog.DiscardHandler))
	if err := s.Arm(crash.Setting{At: p, Mode: crash.Abandon, Once: true}); err != nil {
		t.Fatal(err)
	}
	return s
}

// crashed runs f and reports whether it died at a crash point.
func crashed(f func()) (died bool) {
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			died = true
		}
	}()
	f()
	return false
}

// The relay dies after the broker acked and before it marked the rows: the
// rows stay PENDING and are published again. Inside the dedupe window the
// broker drops the copy; after it, the broker takes it and the inbox
// absorbs it. Either way, one effect.
func TestRelayCrashAfterPublishBeforeMarkPublishesAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		window    time.Duration
		wait      time.Duration
		brokerDup bool
	}{
		{"inside the window: the broker drops it", time.Minute, 0, true},
		{"after the window: the inbox absorbs it", time.Second, 1500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{DuplicateWindow: tc.window})
			ctx := context.Background()
			ids := b.write(t, 3)
			dying := b.relay(t, events.RelayConfig{Lease: 200 * time.Millisecond,
				Crash: abandonAt(t, events.CrashRelayAfterPublishBeforeMark)})
			if !crashed(func() { dying.RunOnce(ctx) }) {
				t.Fatal("the relay did not reach its crash point")
			}
			for _, id := range ids {
				if st, _ := b.outboxStatus(t, id); st != "PENDING" {
					t.Fatalf("after the crash event %s is %s, want PENDING", id, st)
				}
			}
			time.Sleep(300*time.Millisecond + tc.wait) // the dead relay's lease (and the window) run out
			c, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if wantDup := map[bool]int{true: 3, false: 0}[tc.brokerDup]; c.Published != 3 || c.Duplicates != wantDup {
				t.Errorf("second relay = %+v, want 3 published, %d broker duplicates", c, wantDup)
			}
			b.startConsumers(t, 2)
			b.waitApplied(t, ids, 20*time.Second)
			if !tc.brokerDup {
				waitFor(t, 10*time.Second, "the inbox to catch the second copy of every event", func() bool {
					for _, id := range ids {
						if b.deliveries(t, id)[events.OutcomeDuplicate] != len(events.Consumers) { // one per consumer
							return false
						}
					}
					return true
				})
			}
			b.assertOnce(t, ids)
		})
	}
}

func TestConsumerCrashAfterCommitBeforeAckIsRedeliveredAndDeduped(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{AckWait: time.Second})
	ctx := context.Background()
	ids := b.write(t, 1)
	if _, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	h := events.NewHandler(b.db.Pool, events.Ledger{}, events.HandlerConfig{Transport: events.TransportNATS,
		Instance: "dying", Crash: abandonAt(t, events.CrashConsumerAfterCommitBeforeAck)})
	dying, err := b.nats.Consumer(ctx, h, events.ConsumerConfig{Wait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !crashed(func() { dying.RunOnce(ctx) }) {
		t.Fatal("the consumer did not reach its crash point")
	}
	if e := b.effects(t, ids[0]); e.ledger != 1 {
		t.Fatalf("the dying consumer's commit: %d ledger lines, want 1", e.ledger)
	}
	b.startConsumers(t, 1) // the survivors get the unacked delivery after AckWait
	b.waitApplied(t, ids, 20*time.Second)
	waitFor(t, 10*time.Second, "the redelivery to the ledger to be caught by its inbox", func() bool {
		return b.deliveries(t, ids[0])[events.OutcomeDuplicate] == 1
	})
	b.assertOnce(t, ids)
}

// Each mode arms the next n deliveries (or publishes) and must end with
// every event applied once per consumer, and with exactly the duplicates it
// caused caught by the layer it names.
func TestInjectorModesOnNATS(t *testing.T) {
	t.Parallel()
	for _, mode := range events.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{AckWait: time.Second, DuplicateWindow: time.Second})
			checkInjectedMode(t, b, mode, func(ctx context.Context) *events.Relay {
				relay := b.relay(t, events.RelayConfig{})
				if _, err := relay.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
				b.startConsumers(t, 2)
				return relay
			})
		})
	}
}

// checkInjectedMode arms mode, writes events, lets start deliver them, and
// checks the outcome. Consumer-side modes are armed for the ledger only, so
// "the next n deliveries" are the ledger's (redeliveries included).
func checkInjectedMode(t testing.TB, b *bundle, mode events.Mode, start func(context.Context) *events.Relay) {
	t.Helper()
	ctx := context.Background()
	n, consumer := 3, events.ConsumerLedger
	if mode == events.OutOfOrder {
		n = 1 // the first ledger delivery is sent back; the other two overtake it
	}
	if _, err := b.injector.Arm(ctx, mode, consumer, n); err != nil {
		t.Fatal(err)
	}
	within := time.Minute // a bound, generous for a loaded machine
	if mode == events.HoldPastDeadline {
		within = 2 * time.Minute // River hands a held job on at its rescuer's pass, every 30 s
	}
	ids := b.write(t, 3)
	relay := start(ctx)
	b.waitApplied(t, ids, within)
	if relay != nil {
		relay.WaitRepublished()
	}
	count := func(sql string) func() int {
		return func() int {
			var c int
			if err := b.db.Pool.QueryRow(ctx, sql, ids).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	var got func() int
	want := n
	switch {
	case mode == events.OutOfOrder:
		got = count(`SELECT count(*) FROM event_deliveries WHERE event_id = ANY($1) AND outcome = 'deferred'`)
	case mode == events.DeliverTwice && (b.transport == events.TransportNATS || b.transport == events.TransportTasks):
		// at publish: the broker (NATS's window on Nats-Msg-Id; the task
		// queue's on the task name) drops the copy for every consumer
		got = count(`SELECT count(*) FROM event_publishes WHERE event_id = ANY($1) AND duplicate`)
	case (mode == events.DeliverTwice || mode == events.AfterWindow) && b.pub != nil:
		// at publish, and the broker takes the copy (after NATS's window; on
		// Kafka always: no window on the event id): every consumer gets it
		// and its inbox catches it
		want = len(events.Consumers) * n
		got = count(`SELECT count(*) FROM event_deliveries WHERE event_id = ANY($1) AND outcome = 'duplicate' AND caught_by = 'inbox'`)
	default:
		got = count(`SELECT count(*) FROM event_deliveries WHERE event_id = ANY($1) AND consumer = 'ledger'
		              AND outcome = 'duplicate' AND caught_by = 'inbox'`)
	}
	waitFor(t, within, fmt.Sprintf("%s: %d duplicates caught", mode, want), func() bool { return got() >= want })
	time.Sleep(200 * time.Millisecond)
	// A held delivery is handed on after the ack deadline, and how many
	// more times depends on when the holder's late ack lands: at least one
	// duplicate per hold. Every other mode causes exactly one.
	if g := got(); g != want && !(mode == events.HoldPastDeadline && g > want) {
		t.Errorf("%s: %d duplicates caught, want exactly %d", mode, g, want)
	}
	b.assertOnce(t, ids)
	if mode == events.OutOfOrder {
		var deferred, last uuid.UUID
		b.db.Pool.QueryRow(ctx, `SELECT event_id FROM event_deliveries WHERE event_id = ANY($1) AND outcome = 'deferred'`, ids).Scan(&deferred)
		if b.transport == events.TransportKafka {
			// Kafka keeps order within a partition: the events behind the
			// sent-back one on its partition wait for it; those on the
			// other partitions overtake it. So every event the ledger
			// booked after it shares its partition.
			rows, err := b.db.Pool.Query(ctx, `
				SELECT l.event_id, split_part(d.detail, ' offset', 1)
				  FROM ledger_entries l
				  JOIN event_deliveries d ON d.event_id = l.event_id AND d.consumer = 'ledger' AND d.outcome = 'applied'
				 WHERE l.event_id = ANY($1)
				 ORDER BY l.id`, ids)
			if err != nil {
				t.Fatal(err)
			}
			type booked struct {
				ID        uuid.UUID
				Partition string
			}
			order, err := pgx.CollectRows(rows, pgx.RowToStructByPos[booked])
			if err != nil {
				t.Fatal(err)
			}
			after, partition := false, ""
			for _, e := range order {
				if e.ID == deferred {
					after, partition = true, e.Partition
					continue
				}
				if after && e.Partition != partition {
					t.Errorf("out_of_order: %s (%s) was booked after the sent-back %s (%s), from another partition", e.ID, e.Partition, deferred, partition)
				}
			}
			if !after {
				t.Errorf("out_of_order: the sent-back event %s was never booked", deferred)
			}
		} else {
			// What always holds: the sent-back event was applied only after it
			// was sent back. Whether the others overtook it in the second it
			// waits is a matter of speed — on a loaded machine they may not
			// have (seen in a full run) — so that is reported, not asserted.
			var after bool
			b.db.Pool.QueryRow(ctx, `
				SELECT min(id) FILTER (WHERE outcome = 'applied') > min(id) FILTER (WHERE outcome = 'deferred')
				  FROM event_deliveries
				 WHERE event_id = $1
				   AND consumer = 'ledger'`, deferred).Scan(&after)
			if !after {
				t.Errorf("out_of_order: the sent-back event %s was not applied after it was sent back", deferred)
			}
			b.db.Pool.QueryRow(ctx, `SELECT event_id FROM ledger_entries WHERE event_id = ANY($1) ORDER BY id DESC LIMIT 1`, ids).Scan(&last)
			t.Logf("out_of_order: booked last %s (the sent-back one: %v)", last, last == deferred)
		}
	}
	var left int
	b.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(remaining), 0) FROM event_injections`).Scan(&left)
	if left != 0 {
		t.Errorf("%d injections left unused", left)
	}
}

func TestRetentionDeletesOldSentRowsInBatches(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{})
	ctx := context.Background()
	b.write(t, 7)
	relay := b.relay(t, events.RelayConfig{Retention: time.Hour, PurgeBatch: 2})
	if _, err := relay.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	pending := b.write(t, 1)[0]
	if n, err := relay.Purge(ctx, time.Now().Add(30*time.Minute)); err != nil || n != 0 {
		t.Fatalf("purge inside retention removed %d (%v), want 0", n, err)
	}
	if _, err := relay.Purge(ctx, time.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, _ := b.db.Pool.Query(ctx, `SELECT status FROM outbox`)
	left, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	if len(left) != 1 {
		t.Fatalf("after purge %d rows left (%v), want only the PENDING one", len(left), left)
	}
	if st, _ := b.outboxStatus(t, pending); st != "PENDING" {
		t.Errorf("the unsent row is %s", st)
	}
}

func TestReplayOnlyDeadRows(t *testing.T) {
	t.Parallel()
	b := setupNATS(t, testenv.NATSURL(t), events.NATSConfig{})
	ctx := context.Background()
	id := b.write(t, 1)[0]
	if err := events.Replay(ctx, b.db.Pool, id); !errors.Is(err, events.ErrNotDead) {
		t.Errorf("replay of a PENDING row = %v, want ErrNotDead", err)
	}
	if err := events.Replay(ctx, b.db.Pool, uuid.New()); !errors.Is(err, events.ErrEventNotFound) {
		t.Errorf("replay of an unknown id = %v, want ErrEventNotFound", err)
	}
}

func ids(id ...uuid.UUID) []uuid.UUID { return id }

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
