package slots_test

import (
	"context"
	"testing"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/testdb"
)

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
		if _, err := book(ctx, db.Pool, st, ways[0], slot, users[i%2]); err != nil {
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
