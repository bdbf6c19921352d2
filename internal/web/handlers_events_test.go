package web

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemlab/idemlab/internal/events"
)

// The Events page tells events and copies apart (issue 29, finding 25):
// two UUIDv7 ids of one millisecond show different short ids, and a second
// copy that the transport counts as attempt 1 again is not a second
// "delivery 1".
func TestEventLinesTellEventsAndCopiesApart(t *testing.T) {
	// Two ids of one millisecond: the same timestamp, the random tail apart.
	a := uuid.Must(uuid.NewV7())
	b := a
	b[15] ^= 0xff
	if a.String()[:8] != b.String()[:8] {
		t.Fatal("the two ids do not share their millisecond")
	}
	if shortEventID(a) == shortEventID(b) {
		t.Errorf("two events, one short id: %s", shortEventID(a))
	}
	now := time.Now()
	l := eventLine(events.EventRow{ID: a, CreatedAt: now, Deliveries: []events.DeliveryRow{
		{At: now, Consumer: "ledger", Attempt: 1, Outcome: events.OutcomeApplied},
		{At: now, Consumer: "notifications", Attempt: 1, Outcome: events.OutcomeApplied},
		{At: now, Consumer: "ledger", Attempt: 1, Outcome: events.OutcomeDuplicate},
	}}, true)
	if got := [3]int{l.Deliveries[0].Nth, l.Deliveries[1].Nth, l.Deliveries[2].Nth}; got != [3]int{1, 1, 2} {
		t.Errorf("deliveries numbered %v, want 1, 1, 2 (per consumer)", got)
	}
}
