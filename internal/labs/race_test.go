package labs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
)

func TestRaceLab(t *testing.T) {
	t.Parallel()
	for _, strategy := range labs.Strategies {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			lab := labs.NewRaceLab(db.Pool)
			ctx := context.Background()

			res, err := lab.Race(ctx, labs.RaceRequest{Racers: 16, Strategy: strategy, Think: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if res.Won != 1 || res.Refused != 15 || res.Failed != 0 || len(res.Attempts) != 16 {
				t.Fatalf("%s", res.Verdict())
			}
			if res.Slot.Resource != labs.RaceResource || res.Slot.Status != slots.StatusBooked || len(res.Violations) != 0 {
				t.Fatalf("after the race: %+v, violations %v", res.Slot, res.Violations)
			}
			if (strategy == labs.CheckThenInsert) != (res.ConstraintHits > 0) {
				t.Errorf("%s: %d constraint hits (%s)", strategy, res.ConstraintHits, res.Verdict())
			}
			for i, a := range res.Attempts {
				if a.Finished != i+1 || !strings.HasPrefix(a.User, labs.RacerPrefix) {
					t.Errorf("attempt %d: %+v", i, a)
				}
			}
			t.Logf("%s: %s in %s", strategy, res.Verdict(), res.Elapsed)

			// Again on the same slot: everyone is refused, cleanly, and the
			// racers (already made) are reused.
			again, err := lab.Race(ctx, labs.RaceRequest{SlotID: res.Request.SlotID, Racers: 4, Strategy: strategy})
			if err != nil {
				t.Fatal(err)
			}
			if again.Won != 0 || again.Refused != 4 || !strings.Contains(again.Verdict(), "already booked") {
				t.Fatalf("second race: %s", again.Verdict())
			}
			// The race touched the lab's own tables only: no user was made,
			// no business slot or booking exists.
			var users, slotRows, bookings int
			db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM users), (SELECT count(*) FROM slots), (SELECT count(*) FROM bookings)`).
				Scan(&users, &slotRows, &bookings)
			if users != 0 || slotRows != 0 || bookings != 0 {
				t.Errorf("the race left %d users, %d slots, %d bookings in the business tables", users, slotRows, bookings)
			}
			assertNoBusinessSlotBroken(t, db.Pool)
		})
	}
}

func TestRaceRequestsOutOfBoundsAreRefused(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	lab := labs.NewRaceLab(db.Pool)
	for _, r := range []labs.RaceRequest{
		{Racers: 1, Strategy: labs.ConditionalUpdate},
		{Racers: 65, Strategy: labs.ConditionalUpdate},
		{Racers: 2, Strategy: labs.ConditionalUpdate, Think: time.Second},
		{Racers: 2, Strategy: "optimistic"},
	} {
		if _, err := lab.Race(context.Background(), r); !errors.Is(err, labs.ErrInvalidRace) && !errors.Is(err, labs.ErrUnknownStrategy) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if _, err := lab.Race(context.Background(), labs.RaceRequest{SlotID: 999999, Racers: 2, Strategy: labs.ConditionalUpdate}); !errors.Is(err, slots.ErrNotFound) {
		t.Errorf("unknown slot: %v", err)
	}
}

// A slot of the business tables — the demo week, a customer's — is not the
// lab's: racing for its id is "not found", and it stays as it was.
func TestRaceLabNeverTouchesABusinessSlot(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	slotIDs := businessSlots(t, db.Pool, 3)
	lab := labs.NewRaceLab(db.Pool)
	for _, id := range slotIDs {
		if _, err := lab.Race(context.Background(), labs.RaceRequest{SlotID: id, Racers: 2, Strategy: labs.ConditionalUpdate}); !errors.Is(err, slots.ErrNotFound) {
			t.Errorf("racing for business slot %d: %v, want ErrNotFound", id, err)
		}
	}
	var booked int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM slots WHERE status <> 'AVAILABLE'`).Scan(&booked)
	if booked != 0 {
		t.Fatalf("%d business slots booked by the lab", booked)
	}
}

// businessSlots makes n slots of the business tables (the demo week's kind).
func businessSlots(t testing.TB, pool *pgxpool.Pool, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		INSERT INTO slots (resource, starts_at, ends_at)
		SELECT 'Room A', t, t + interval '1 hour'
		  FROM generate_series(date_trunc('hour', now()) + interval '1 hour', date_trunc('hour', now()) + $1 * interval '1 hour', interval '1 hour') AS t
		RETURNING id`, n)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id)
		ids = append(ids, id)
	}
	if rows.Err() != nil || len(ids) != n {
		t.Fatalf("business slots: %v", rows.Err())
	}
	return ids
}

// assertNoBusinessSlotBroken checks invariant 3 over the business tables.
func assertNoBusinessSlotBroken(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	v, err := slots.NewStore(pool).CheckInvariant(context.Background())
	if err != nil || len(v) != 0 {
		t.Fatalf("invariant 3: %v %v", v, err)
	}
}

func TestParseStrategy(t *testing.T) {
	if s, err := labs.ParseStrategy(""); err != nil || s != labs.ConditionalUpdate {
		t.Errorf(`ParseStrategy("") = %v, %v`, s, err)
	}
	if _, err := labs.ParseStrategy("optimistic"); !errors.Is(err, labs.ErrUnknownStrategy) {
		t.Errorf("unknown strategy: %v", err)
	}
}
