package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/testdb"
)

// depositSlot returns the id of the nth AVAILABLE slot that needs a deposit.
func depositSlot(t testing.TB, db *testdb.DB, nth int) int64 {
	t.Helper()
	var id int64
	err := db.Pool.QueryRow(context.Background(), `
		SELECT id FROM slots WHERE status = 'AVAILABLE' AND resource = $1 ORDER BY id OFFSET $2 LIMIT 1`,
		demo.DepositResource, nth).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// The deposit saga over HTTP: a held slot answers other bookers 409
// slot-held (not slot-taken) with until when; the holder's own answer is
// 202 while the charge is unknown, replayed as stored; a declined deposit
// is 402 deposit-declined with the booking FAILED and the slot free.
func TestDepositBookingOverHTTP(t *testing.T) {
	t.Parallel()
	// The charge stays RUNNING for a minute; the app waits 2 s — long
	// enough that a refusal on a loaded machine is still an answer.
	s := startServer(t, map[string]string{"PAYMENTS_TIMEOUT": "2s"})
	setPayments := func(body string) {
		t.Helper()
		if r := s.do(request{Method: "PUT", Path: "/api/v1/payments/faults", Token: "demo-admin", Body: body}); r.Status != http.StatusOK {
			t.Fatalf("payments faults %s: %d %s", body, r.Status, r.Body)
		}
	}
	setPayments(`{"mode":"slow","slow_ms":60000}`)
	held := depositSlot(t, s.DB, 0)
	key := newKey()
	first := s.book("demo-alice", held, key, "")
	var b struct {
		bookingJSON
		DepositCents int64 `json:"deposit_cents"`
		Operation    struct {
			ID     int64  `json:"id"`
			Status string `json:"status"`
			Steps  []struct {
				Name, State string
			} `json:"steps"`
		} `json:"operation"`
	}
	first.JSON(t, &b)
	if first.Status != http.StatusAccepted || b.Status != "PENDING" || b.DepositCents != demo.DepositCents ||
		first.Header.Get("Location") != fmt.Sprintf("/api/v1/bookings/%d", b.ID) || b.Operation.Status != "IN_PROGRESS" {
		t.Fatalf("a deposit whose charge is unknown: %d %s", first.Status, first.Body)
	}
	if len(b.Operation.Steps) != 3 || b.Operation.Steps[1].Name != "charge_deposit" || b.Operation.Steps[1].State != "UNKNOWN" {
		t.Errorf("steps %+v", b.Operation.Steps)
	}
	assertReplay(t, first, s.book("demo-alice", held, key, ""))

	// Bob meets the hold: 409 slot-held, saying until when — not slot-taken.
	r := s.book("demo-bob", held, newKey(), "")
	var p struct {
		Type, Detail string
		HeldUntil    time.Time `json:"held_until"`
		SlotID       int64     `json:"slot_id"`
	}
	r.JSON(t, &p)
	if r.Status != http.StatusConflict || p.Type != "slot-held" || p.SlotID != held || p.HeldUntil.Before(time.Now()) ||
		!strings.Contains(p.Detail, "until") || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("bob on a held slot: %d %s", r.Status, r.Body)
	}
	// The grid's API lists it HELD, with its time.
	var list pageJSON[struct {
		ID        int64      `json:"id"`
		Status    string     `json:"status"`
		HeldUntil *time.Time `json:"held_until"`
	}]
	s.do(request{Method: "GET", Path: "/api/v1/slots?status=HELD", Token: "demo-bob"}).JSON(t, &list)
	if len(list.Items) != 1 || list.Items[0].ID != held || list.Items[0].HeldUntil == nil {
		t.Errorf("HELD slots: %+v", list.Items)
	}

	// A declined deposit: 402, the hold released in the same commit.
	setPayments(`{"mode":"reject"}`)
	declined := depositSlot(t, s.DB, 0)
	r = s.book("demo-carol", declined, newKey(), "")
	var d struct {
		Type          string `json:"type"`
		BookingID     int64  `json:"booking_id"`
		BookingStatus string `json:"booking_status"`
		OperationID   int64  `json:"operation_id"`
	}
	r.JSON(t, &d)
	if r.Status != http.StatusPaymentRequired || d.Type != "deposit-declined" || d.BookingStatus != "FAILED" || d.OperationID == 0 {
		t.Fatalf("declined deposit: %d %s", r.Status, r.Body)
	}
	var slotStatus string
	s.DB.Pool.QueryRow(context.Background(), `SELECT status FROM slots WHERE id = $1`, declined).Scan(&slotStatus)
	if slotStatus != "AVAILABLE" {
		t.Errorf("the declined deposit's slot is %s", slotStatus)
	}

	// Paid and cancelled: 201, then 200 CANCELLED once the refund is done.
	setPayments(`{"mode":"ok"}`)
	paid := depositSlot(t, s.DB, 1)
	r = s.book("demo-carol", paid, newKey(), "")
	r.JSON(t, &b)
	if r.Status != http.StatusCreated || b.Status != "CONFIRMED" {
		t.Fatalf("a paid deposit: %d %s", r.Status, r.Body)
	}
	if r := s.release("demo-carol", b.ID, newKey()); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"status":"CANCELLED"`) {
		t.Fatalf("cancel a deposit booking: %d %s", r.Status, r.Body)
	}
	var invariantsOK struct{ OK bool }
	s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"}).JSON(t, &invariantsOK)
	if !invariantsOK.OK {
		t.Errorf("invariants: %s", s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"}).Body)
	}
}
