package slots_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
)

// fixture makes n users and one slot per resource given, returning their ids.
func fixture(t testing.TB, pool *pgxpool.Pool, nUsers, nSlots int) (users, slotIDs []int64) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `
		INSERT INTO users (name, api_token_sha256)
		SELECT 'user' || i, sha256(('token' || i)::bytea)
		  FROM generate_series(1, $1) AS i
		RETURNING id`, nUsers)
	if err != nil {
		t.Fatal(err)
	}
	users, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `
		INSERT INTO slots (resource, starts_at, ends_at)
		SELECT 'room', date_trunc('hour', now()) + make_interval(hours => i),
		       date_trunc('hour', now()) + make_interval(hours => i + 1)
		  FROM generate_series(1, $1) AS i
		RETURNING id`, nSlots)
	if err != nil {
		t.Fatal(err)
	}
	slotIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return users, slotIDs
}

// way is one of the store's two ways to book: Book (the conditional
// UPDATE, what the app runs) and BookWithRowLock (the documented
// alternative).
type way struct {
	name string
	book func(*slots.Store) func(ctx context.Context, tx pgx.Tx, slotID, userID int64) (slots.Booking, error)
}

var ways = []way{
	{"conditional-update", func(st *slots.Store) func(context.Context, pgx.Tx, int64, int64) (slots.Booking, error) {
		return st.Book
	}},
	{"row-lock", func(st *slots.Store) func(context.Context, pgx.Tx, int64, int64) (slots.Booking, error) {
		return st.BookWithRowLock
	}},
}

// book books slotID for userID in a transaction of its own, w's way.
func book(ctx context.Context, pool *pgxpool.Pool, st *slots.Store, w way, slotID, userID int64) (slots.Booking, error) {
	var b slots.Booking
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		b, err = w.book(st)(ctx, tx, slotID, userID)
		return err
	})
	return b, err
}

// warmPool opens every connection of the pool before a race, so racers
// contend on rows rather than on connection set-up.
func warmPool(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	conns := make([]*pgxpool.Conn, pool.Config().MaxConns)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// assertSlotInvariant checks invariant 3 of docs/invariants.md over the whole table:
// at most one confirmed booking per slot, and a slot is BOOKED exactly when
// it has one (and points at it).
func assertSlotInvariant(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	var bad int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*)
		  FROM slots s
		  LEFT JOIN bookings b ON b.slot_id = s.id AND b.status = 'CONFIRMED'
		 WHERE (s.status = 'BOOKED') <> (b.id IS NOT NULL)
		    OR (b.id IS NOT NULL AND s.booking_id IS DISTINCT FROM b.id)`).Scan(&bad)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("invariant 3 broken on %d slots", bad)
	}
}

func TestManyUsersRaceForOneSlot(t *testing.T) {
	t.Parallel()
	for _, w := range ways {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			const racers = 64
			users, slotIDs := fixture(t, db.Pool, racers, 1)
			st := slots.NewStore(db.Pool)
			ctx := context.Background()

			warmPool(t, db.Pool)
			start := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			var won, taken int
			var other []error
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, err := book(ctx, db.Pool, st, w, slotIDs[0], users[i])
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						won++
					case errors.Is(err, slots.ErrSlotTaken):
						taken++
					default:
						other = append(other, err)
					}
				}()
			}
			close(start) // release every racer at once
			wg.Wait()

			if len(other) > 0 || won != 1 || taken != racers-1 {
				t.Fatalf("won %d, taken %d, other errors %v", won, taken, other)
			}
			var confirmed int
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM bookings WHERE status = 'CONFIRMED'`).Scan(&confirmed)
			if confirmed != 1 {
				t.Fatalf("%d confirmed bookings", confirmed)
			}
			assertSlotInvariant(t, db.Pool)
		})
	}
}

func TestBookReleaseBookAgain(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	users, slotIDs := fixture(t, db.Pool, 3, 1)
	alice, bob, carol := users[0], users[1], users[2]
	st := slots.NewStore(db.Pool)
	ctx := context.Background()

	b, err := book(ctx, db.Pool, st, ways[0], slotIDs[0], alice)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := book(ctx, db.Pool, st, ways[1], slotIDs[0], bob); !errors.Is(err, slots.ErrSlotTaken) {
		t.Fatalf("bob booking a booked slot: %v", err)
	}
	release := func(bookingID, userID int64, admin bool) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.Release(ctx, tx, bookingID, userID, admin)
			return err
		})
	}
	if err := release(b.ID, bob, false); !errors.Is(err, slots.ErrBookingNotFound) {
		t.Fatalf("bob releasing alice's booking: %v, want ErrBookingNotFound", err)
	}
	if err := release(b.ID, alice, false); err != nil {
		t.Fatalf("alice releasing her booking: %v", err)
	}
	if err := release(b.ID, alice, false); !errors.Is(err, slots.ErrBookingNotConfirmed) {
		t.Fatalf("releasing twice: %v", err)
	}
	assertSlotInvariant(t, db.Pool)
	b2, err := book(ctx, db.Pool, st, ways[1], slotIDs[0], bob)
	if err != nil || b2.UserID != bob {
		t.Fatalf("bob after release: %+v %v", b2, err)
	}
	if err := release(b2.ID, carol, true); err != nil {
		t.Fatalf("admin releasing bob's booking: %v", err)
	}
	assertSlotInvariant(t, db.Pool)
	for _, w := range ways {
		if _, err := book(ctx, db.Pool, st, w, 999999, bob); !errors.Is(err, slots.ErrNotFound) {
			t.Errorf("%s on unknown slot: %v", w.name, err)
		}
	}
}

// BenchmarkBookUnderContention: 32 clients, 8 slots. Each iteration is one
// booking attempt; a won slot is released by the next winner's cleanup so
// the race goes on.
func BenchmarkBookUnderContention(b *testing.B) {
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			db := testdb.New(b)
			users, slotIDs := fixture(b, db.Pool, 32, 8)
			st := slots.NewStore(db.Pool)
			ctx := context.Background()
			var mu sync.Mutex
			var won, taken int
			var next int
			b.SetParallelism(16) // 2 cores × 16 = 32 clients
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				user := users[next%len(users)]
				next++
				mu.Unlock()
				i := 0
				for pb.Next() {
					slot := slotIDs[i%len(slotIDs)]
					i++
					bk, err := book(ctx, db.Pool, st, w, slot, user)
					switch {
					case err == nil:
						mu.Lock()
						won++
						mu.Unlock()
						// free it again so the contention continues
						pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
							_, err := st.Release(ctx, tx, bk.ID, user, false)
							return err
						})
					case errors.Is(err, slots.ErrSlotTaken):
						mu.Lock()
						taken++
						mu.Unlock()
					default:
						b.Error(err)
					}
				}
			})
			b.ReportMetric(float64(won+taken)/time.Since(start).Seconds(), "attempts/s")
			b.ReportMetric(float64(won)/float64(won+taken), "win-ratio")
			assertSlotInvariant(b, db.Pool)
		})
	}
}

// A slot that has begun cannot be booked, whichever way decides: the
// refusal is ErrSlotInPast (not "taken", not "not found") and nothing is
// written. A slot a minute ahead still can be.
func TestPastSlotsCannotBeBooked(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	users, ids := fixture(t, db.Pool, 1, 2)
	if _, err := db.Pool.Exec(ctx, `
		UPDATE slots SET starts_at = now() - interval '5 minutes', ends_at = now() + interval '55 minutes' WHERE id = $1;`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		UPDATE slots SET starts_at = now() + interval '1 minute', ends_at = now() + interval '61 minutes' WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	st := slots.NewStore(db.Pool)
	for _, w := range ways {
		if _, err := book(ctx, db.Pool, st, w, ids[0], users[0]); !errors.Is(err, slots.ErrSlotInPast) {
			t.Errorf("%s: booking a slot that began 5 minutes ago: %v, want ErrSlotInPast", w.name, err)
		}
	}
	var bookings int
	db.Pool.QueryRow(ctx, `SELECT count(*) FROM bookings`).Scan(&bookings)
	if bookings != 0 {
		t.Fatalf("%d bookings written for a past slot", bookings)
	}
	if _, err := book(ctx, db.Pool, st, ways[0], ids[1], users[0]); err != nil {
		t.Fatalf("a slot a minute ahead: %v", err)
	}
	assertSlotInvariant(t, db.Pool)
}
