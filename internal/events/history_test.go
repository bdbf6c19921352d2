package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/testenv"
)

// Write gives one aggregate's events the places 1, 2, 3 in commit order,
// even when its writers run at once; another aggregate counts on its own.
func TestWriteNumbersEachAggregateInCommitOrder(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			<-start
			err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Write(ctx, tx, events.Event{Type: events.TypeBookingConfirmed, Key: "booking:1", Payload: i})
				return err
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	// A rolled-back write hands its place back: no gap.
	pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		outbox.Write(ctx, tx, events.Event{Type: events.TypeBookingReleased, Key: "booking:1", Payload: 0})
		return fmt.Errorf("roll back")
	})
	pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := outbox.Write(ctx, tx, events.Event{Type: events.TypeBookingReleased, Key: "booking:2", Payload: 0})
		return err
	})
	rows, _ := db.Pool.Query(ctx, `SELECT key, seq FROM outbox ORDER BY key, seq`)
	type place struct {
		Key string
		Seq int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[place])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 {
		t.Fatalf("%d rows: %v", len(got), got)
	}
	for i, p := range got[:8] {
		if p.Key != "booking:1" || p.Seq != int64(i+1) {
			t.Errorf("row %d: %+v, want booking:1 #%d", i, p, i+1)
		}
	}
	if got[8] != (place{"booking:2", 1}) {
		t.Errorf("the other aggregate: %+v", got[8])
	}
}

// The history consumer through the consumer rule: held, confirmed,
// released delivered released first, confirmed twice, and the three at
// once from several goroutines — the projection ends released at version
// 3 every time, each event at its place; an early event is parked until
// its predecessor comes. A naive fold of the same arrivals would end
// "confirmed".
func TestHistoryAppliesOneAggregateInOrderWhateverTheArrival(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	h := events.NewHandler(db.Pool, events.History{}, events.HandlerConfig{Transport: "test", Instance: "test"})
	msg := func(key string, seq int64, typ string) events.Message {
		return events.Message{ID: uuid.New(), Type: typ, Key: key, Seq: seq, Payload: json.RawMessage(`{}`), CreatedAt: time.Now()}
	}
	deliver := func(m events.Message) string {
		t.Helper()
		out, err := h.Handle(ctx, events.Delivery{Message: m, Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	state := func(key string) (int64, string, int) {
		var v int64
		var s *string
		var parked int
		db.Pool.QueryRow(ctx, `SELECT version, state, (SELECT count(*) FROM history_parked WHERE key = $1)
		                         FROM histories WHERE key = $1`, key).Scan(&v, &s, &parked)
		if s == nil {
			return v, "", parked
		}
		return v, *s, parked
	}

	held, confirmed, released := msg("booking:7", 1, events.TypeBookingHeld), msg("booking:7", 2, events.TypeBookingConfirmed), msg("booking:7", 3, events.TypeBookingReleased)
	deliver(held)
	deliver(released) // early: parked
	if v, s, parked := state("booking:7"); v != 1 || s != "held" || parked != 1 {
		t.Fatalf("after held and an early released: version %d, %q, %d parked; want 1, held, 1", v, s, parked)
	}
	deliver(confirmed) // the predecessor: applied, then the parked release
	if out := deliver(confirmed); out != events.OutcomeDuplicate {
		t.Errorf("a copy: %s, want duplicate", out)
	}
	if v, s, parked := state("booking:7"); v != 3 || s != "released" || parked != 0 {
		t.Fatalf("after all three: version %d, %q, %d parked; want 3, released, 0", v, s, parked)
	}
	var parkedThenApplied int
	db.Pool.QueryRow(ctx, `SELECT count(*) FROM history_events WHERE key = 'booking:7' AND parked_at IS NOT NULL`).Scan(&parkedThenApplied)
	if parkedThenApplied != 1 {
		t.Errorf("%d events applied from the park, want 1 (the release)", parkedThenApplied)
	}
	// The Events overview (GET /api/v1/events) counts the same.
	o, err := events.NewStore(db.Pool).Overview(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (events.HistoryStats{Aggregates: 1, ParkedNow: 0, ParkedThenApplied: 1}); o.History != want {
		t.Errorf("overview's history: %+v, want %+v", o.History, want)
	}

	// Concurrent arrivals, in every order at once, 20 aggregates: the row
	// lock makes each aggregate's deliveries take turns, so no early event
	// is parked after its predecessor looked for it.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for a := range 20 {
		key := fmt.Sprintf("booking:%d", 100+a)
		for _, m := range []events.Message{msg(key, 3, events.TypeBookingReleased), msg(key, 1, events.TypeBookingHeld), msg(key, 2, events.TypeBookingConfirmed)} {
			wg.Go(func() {
				<-start
				if _, err := h.Handle(ctx, events.Delivery{Message: m, Attempt: 1}); err != nil {
					t.Error(err)
				}
			})
		}
	}
	close(start)
	wg.Wait()
	for a := range 20 {
		key := fmt.Sprintf("booking:%d", 100+a)
		if v, s, parked := state(key); v != 3 || s != "released" || parked != 0 {
			t.Errorf("%s: version %d, %q, %d parked; want 3, released, 0", key, v, s, parked)
		}
	}
	r, err := invariants.Check(ctx, db.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Errorf("invariants: %+v", r.Violations)
	}

	// The invariant sees a projection that is not the fold of its events.
	db.Pool.Exec(ctx, `UPDATE histories SET state = 'confirmed' WHERE key = 'booking:7'`)
	r, _ = invariants.Check(ctx, db.Pool, invariants.Options{})
	if r.OK {
		t.Error("a projection that is not the fold of its events was not reported")
	}
}

// On a real transport under the out_of_order injector: the history's first
// delivery of a booking (held) is sent back for a second, its confirmed
// and released overtake it and are parked, and when held comes back the
// three are applied in order. Same on NATS (lanes) and River (no order).
func TestHistoryInOrderUnderOutOfOrderOnNATSAndRiver(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{events.TransportNATS, events.TransportRiver} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var b *bundle
			if transport == events.TransportNATS {
				b = setupNATS(t, testenv.NATSURL(t), events.NATSConfig{})
			} else {
				b = &bundle{db: testdb.New(t), transport: events.TransportRiver}
				b.injector = events.NewInjector(b.db.Pool)
				b.userID = demoUser(t, b.db)
				if err := events.SetTransport(ctx, b.db.Pool, events.TransportRiver); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.injector.Arm(ctx, events.OutOfOrder, events.ConsumerHistory, 1); err != nil {
				t.Fatal(err)
			}
			var ids []uuid.UUID
			for _, typ := range []string{events.TypeBookingHeld, events.TypeBookingConfirmed, events.TypeBookingReleased} {
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					id, err := outbox.Write(ctx, tx, events.Event{Type: typ, Key: "booking:7",
						Payload: events.BookingChanged{BookingID: 7, UserID: b.userID, At: time.Now()}})
					ids = append(ids, id)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if transport == events.TransportNATS {
				b.startConsumers(t, 2)
				if _, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				b.startRiverConsumers(t, 2, events.RiverConfig{}, nil)
			}
			waitFor(t, time.Minute, "the history to reach version 3", func() bool {
				var v int64
				b.db.Pool.QueryRow(ctx, `SELECT version FROM histories WHERE key = 'booking:7'`).Scan(&v)
				return v == 3
			})
			var state string
			var deferred, fromPark int
			b.db.Pool.QueryRow(ctx, `SELECT state FROM histories WHERE key = 'booking:7'`).Scan(&state)
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM event_deliveries WHERE consumer = 'history' AND outcome = 'deferred'`).Scan(&deferred)
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM history_events WHERE key = 'booking:7' AND parked_at IS NOT NULL`).Scan(&fromPark)
			if state != "released" || deferred != 1 {
				t.Errorf("state %q, %d deliveries sent back; want released, 1", state, deferred)
			}
			t.Logf("%s: %d of 3 events were parked, then applied in order", transport, fromPark)
			waitFor(t, time.Minute, "every consumer to take every event", func() bool {
				var n int
				b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE event_id = ANY($1)`, ids).Scan(&n)
				return n == len(events.Consumers)*len(ids)
			})
			if r, err := invariants.Check(ctx, b.db.Pool, invariants.Options{}); err != nil || !r.OK {
				t.Errorf("invariants: %+v %v", r.Violations, err)
			}
		})
	}
}
