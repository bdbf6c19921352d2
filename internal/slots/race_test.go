package slots_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
)

func TestRaceLab(t *testing.T) {
	t.Parallel()
	for _, strategy := range slots.Strategies {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			lab := slots.NewLab(db.Pool)
			ctx := context.Background()

			res, err := lab.Race(ctx, slots.RaceRequest{Racers: 16, Strategy: strategy, Think: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if res.Won != 1 || res.Refused != 15 || res.Failed != 0 || len(res.Attempts) != 16 {
				t.Fatalf("%s", res.Verdict())
			}
			if res.Slot.Resource != slots.LabResource || res.Slot.Status != slots.StatusBooked || len(res.Violations) != 0 {
				t.Fatalf("after the race: %+v, violations %v", res.Slot, res.Violations)
			}
			if (strategy == slots.CheckThenInsert) != (res.ConstraintHits > 0) {
				t.Errorf("%s: %d constraint hits (%s)", strategy, res.ConstraintHits, res.Verdict())
			}
			for i, a := range res.Attempts {
				if a.Finished != i+1 || !strings.HasPrefix(a.User, slots.RacerPrefix) {
					t.Errorf("attempt %d: %+v", i, a)
				}
			}
			t.Logf("%s: %s in %s", strategy, res.Verdict(), res.Elapsed)

			// Again on the same slot: everyone is refused, cleanly, and the
			// racers (already made) are reused.
			again, err := lab.Race(ctx, slots.RaceRequest{SlotID: res.Request.SlotID, Racers: 4, Strategy: strategy})
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
			assertSlotInvariant(t, db.Pool)
		})
	}
}

func TestRaceRequestsOutOfBoundsAreRefused(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	lab := slots.NewLab(db.Pool)
	for _, r := range []slots.RaceRequest{
		{Racers: 1, Strategy: slots.ConditionalUpdate},
		{Racers: 65, Strategy: slots.ConditionalUpdate},
		{Racers: 2, Strategy: slots.ConditionalUpdate, Think: time.Second},
		{Racers: 2, Strategy: "optimistic"},
	} {
		if _, err := lab.Race(context.Background(), r); !errors.Is(err, slots.ErrInvalidRace) && !errors.Is(err, slots.ErrUnknownStrategy) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	if _, err := lab.Race(context.Background(), slots.RaceRequest{SlotID: 999999, Racers: 2, Strategy: slots.ConditionalUpdate}); !errors.Is(err, slots.ErrNotFound) {
		t.Errorf("unknown slot: %v", err)
	}
}

// A slot of the business tables — the demo week, a customer's — is not the
// lab's: racing for its id is "not found", and it stays as it was.
func TestRaceLabNeverTouchesABusinessSlot(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	_, slotIDs := fixture(t, db.Pool, 1, 3)
	lab := slots.NewLab(db.Pool)
	for _, id := range slotIDs {
		if _, err := lab.Race(context.Background(), slots.RaceRequest{SlotID: id, Racers: 2, Strategy: slots.ConditionalUpdate}); !errors.Is(err, slots.ErrNotFound) {
			t.Errorf("racing for business slot %d: %v, want ErrNotFound", id, err)
		}
	}
	var booked int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM slots WHERE status <> 'AVAILABLE'`).Scan(&booked)
	if booked != 0 {
		t.Fatalf("%d business slots booked by the lab", booked)
	}
}

func TestCheckInvariantFindsABrokenSlot(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	users, slotIDs := fixture(t, db.Pool, 1, 2)
	st := slots.NewStore(db.Pool)
	ctx := context.Background()
	if v, err := st.CheckInvariant(ctx); err != nil || len(v) != 0 {
		t.Fatalf("fresh data: %v %v", v, err)
	}
	// A confirmed booking the slot does not know about: what a buggy
	// writer that skipped the slot update would leave behind.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO bookings (slot_id, user_id) VALUES ($1, $2)`, slotIDs[1], users[0]); err != nil {
		t.Fatal(err)
	}
	v, err := st.CheckInvariant(ctx)
	if err != nil || len(v) != 1 || v[0].SlotID != slotIDs[1] || v[0].Confirmed != 1 {
		t.Fatalf("got %v %v", v, err)
	}
	t.Log(v[0])
}

func TestListBookingsIsPerUser(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	users, slotIDs := fixture(t, db.Pool, 2, 3)
	st := slots.NewStore(db.Pool)
	ctx := context.Background()
	for i, slot := range slotIDs {
		if _, _, err := book(ctx, db.Pool, st, slots.ConditionalUpdate, slot, users[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	mine, err := st.ListBookings(ctx, slots.BookingFilter{UserID: users[0], Limit: 10})
	if err != nil || len(mine) != 2 || mine[0].SlotID != slotIDs[0] || mine[1].SlotID != slotIDs[2] {
		t.Fatalf("%+v %v", mine, err)
	}
	page2, err := st.ListBookings(ctx, slots.BookingFilter{UserID: users[0], AfterID: mine[0].ID, Status: slots.BookingConfirmed, Limit: 10})
	if err != nil || len(page2) != 1 || page2[0].ID != mine[1].ID {
		t.Fatalf("after the cursor: %+v %v", page2, err)
	}
}
