package main

import (
	"context"
	"errors"
	"math/rand/v2"
)

// A scenario is a named workload: the intents each client draws from, in
// proportion to their weights, and the provider fault in force meanwhile.
type scenario struct {
	order int // in -h and in the docs
	about string
	// faults is PUT to /api/v1/provider/faults before the run and healed
	// (provider ok) after it; nil leaves the provider as it is.
	faults map[string]any
	// paymentsFaults is the same for the payments service.
	paymentsFaults map[string]any
	// depositSlots: the reset makes -slots slots that need a deposit (the
	// deposit saga), and the workload books only those.
	depositSlots bool
	intents      []weighted
	// prepare, when set, runs before the clock starts (unrecorded).
	prepare func(ctx context.Context, r *runState) error
}

type weighted struct {
	weight int
	do     intent
}

// An intent is one thing a user means to do — cancel a policy, book a
// slot — carried out with however many requests the scenario's user
// sends for it. It returns errExhausted when there is nothing left to do.
type intent func(ctx context.Context, w *worker) error

// errExhausted: the dataset's ACTIVE policies (or free slots) are used up;
// the client stops.
var errExhausted = errors.New("nothing left: no ACTIVE policy to cancel or free slot to book")

var flakyProvider = map[string]any{
	"mode": "flaky", "idempotent": true,
	// slow calls stay RUNNING for a second: longer than the app waits, short
	// enough that recovery finds them COMPLETED soon after
	"slow_ms": 1000,
}

var healthyProvider = map[string]any{"mode": "ok", "idempotent": true}

// flakyPayments declines some deposits, times out on others (never
// arrived, charged but the answer lost, still running): each must end in
// the right state — a hold released only for a charge known not to exist.
var flakyPayments = map[string]any{
	"mode": "flaky", "idempotent": true, "slow_ms": 1000,
	"weights": map[string]int{"ok": 5, "reject": 2, "error": 1, "drop": 1, "lost_response": 1, "slow": 2},
}

var scenarios = map[string]*scenario{
	"retry-storm": {order: 1,
		about:   "every cancel and book sent 2–4 times with one key, some copies at once, some after a pause; every answer for a key must agree",
		intents: []weighted{{3, stormCancel}, {2, stormBook}}},
	"double-click": {order: 2,
		about:   "every intent sent twice at once with two different keys; at most one may win",
		intents: []weighted{{3, doubleClickCancel}, {2, doubleClickBook}}},
	"slot-race": {order: 3,
		about:   "many users book the same few slots; a winner releases soon after, so the race goes on",
		intents: []weighted{{1, raceBook}}},
	"timeouts": {order: 4,
		about:   "cancellations (with retry storms) against a flaky provider, healed at the end; then recovery must drain",
		faults:  flakyProvider,
		intents: []weighted{{3, stormCancel}, {1, doubleClickCancel}}},
	"mixed": {order: 5,
		about:   "all of the above but the faults, plus reads",
		intents: []weighted{{3, stormCancel}, {2, doubleClickCancel}, {2, stormBook}, {2, raceBook}, {1, doubleClickBook}, {3, readLists}}},

	// Single-purpose workloads, measured by `make bench` (docs/performance.md).
	"cancel": {order: 6,
		about:   "each policy cancelled once, one request, one key (provider as it is: bench sets ok)",
		intents: []weighted{{1, cancelOnce}}},
	"replay": {order: 7,
		about:   "the replay of completed keys: 256 cancellations first (unrecorded), then the same requests again and again",
		prepare: prepareReplay,
		intents: []weighted{{1, replayCompleted}}},
	"book": {order: 8,
		about:   "book a random slot with a fresh key; a winner releases it at once (contention: use few -slots)",
		intents: []weighted{{1, raceBook}}},
	"book-free": {order: 9,
		about:   "each slot booked once, by one request with one key: bookings that never contend (use many -slots)",
		intents: []weighted{{1, bookFreeSlot}}},
	"deposit": {order: 10,
		about: "many users book a few slots that need a deposit (the saga: hold, charge, confirm) with payments flaky, " +
			"stormed; winners cancel (refund, then release); healed at the end, recovery drains, then the invariants",
		paymentsFaults: flakyPayments,
		depositSlots:   true,
		intents:        []weighted{{3, depositBook}, {1, doubleClickBook}}},
}

// pick draws one of the scenario's intents by weight.
func (s *scenario) pick(rng *rand.Rand) intent {
	total := 0
	for _, in := range s.intents {
		total += in.weight
	}
	n := rng.IntN(total)
	for _, in := range s.intents {
		if n < in.weight {
			return in.do
		}
		n -= in.weight
	}
	panic("unreachable")
}
