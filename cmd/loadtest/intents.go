package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/pause"
)

// worker is one simulated client. It owns its random source, so a seed
// gives every client the same sequence of choices run after run.
type worker struct {
	id   int
	rng  *rand.Rand
	c    *client
	d    *dataset
	rec  *recorder
	run  *runState
	keys int
}

// newKey mints an Idempotency-Key no earlier run used: the run's nonce,
// the client and a counter.
func (w *worker) newKey() string {
	w.keys++
	w.rec.mintedKeys(1)
	return fmt.Sprintf("lt-%s-%d-%d", w.run.nonce, w.id, w.keys)
}

var cancelBody = []byte(`{"reason":"loadtest"}`)

func cancelRequest(p policyRef, token, key string) request {
	return request{method: http.MethodPost, path: fmt.Sprintf("/api/v1/policies/%d/cancel", p.id), token: token, key: key, body: cancelBody}
}

func bookRequest(slotID int64, token, key string) request {
	return request{method: http.MethodPost, path: fmt.Sprintf("/api/v1/slots/%d/book", slotID), token: token, key: key}
}

func releaseRequest(bookingID int64, token, key string) request {
	return request{method: http.MethodPost, path: fmt.Sprintf("/api/v1/bookings/%d/cancel", bookingID), token: token, key: key}
}

// storm sends req 2–4 times with the same key: some copies at the same
// moment, the rest one by one after a pause, as a client retrying on a
// flaky network would. It checks what the protocol promises — every copy
// that is not refused as in flight gets the same status and body, and only
// one of them executed (the others say Idempotent-Replayed) — and returns
// the answer the client would act on.
func (w *worker) storm(ctx context.Context, req request) answer {
	copies := 2 + w.rng.IntN(3)
	together := 1 + w.rng.IntN(copies)
	pauses := make([]time.Duration, copies-together)
	for i := range pauses {
		pauses[i] = time.Duration(5+w.rng.IntN(150)) * time.Millisecond
	}
	answers := make([]answer, copies)
	var wg sync.WaitGroup
	for i := range together {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = w.c.send(ctx, req) }()
	}
	wg.Wait()
	for i, p := range pauses {
		if !pause.For(ctx, p) {
			break
		}
		answers[together+i] = w.c.send(ctx, req)
	}
	return w.checkOneAnswer(req, answers)
}

// checkOneAnswer records an anomaly when the answers for one key disagree
// or more than one copy executed, and returns the first decisive answer.
// In-flight refusals (409 request-in-progress), 5xx (the key is released,
// so a retry executes again) and missing answers decide nothing.
func (w *worker) checkOneAnswer(req request, answers []answer) answer {
	var first *answer
	executed := 0
	for i := range answers {
		a := &answers[i]
		if a.status == 0 || a.err != nil || a.inFlight() || a.status >= 500 {
			continue
		}
		if !a.replayed {
			executed++
		}
		if first == nil {
			first = a
			continue
		}
		if a.status != first.status || !bytes.Equal(a.body, first.body) {
			w.rec.anomaly(fmt.Sprintf("key %s (%s %s): answers disagree: %s then %s", req.key, req.method, req.path, first.label(), a.label()))
		}
	}
	if executed > 1 {
		w.rec.anomaly(fmt.Sprintf("key %s (%s %s): executed %d times (answers without Idempotent-Replayed)", req.key, req.method, req.path, executed))
	}
	if first == nil {
		return answer{}
	}
	return *first
}

// together sends reqs at once (the second up to 20 ms later: two clicks)
// and returns their answers in order.
func (w *worker) together(ctx context.Context, reqs ...request) []answer {
	answers := make([]answer, len(reqs))
	delays := make([]time.Duration, len(reqs))
	for i := 1; i < len(reqs); i++ {
		delays[i] = time.Duration(w.rng.IntN(20)) * time.Millisecond
	}
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if pause.For(ctx, delays[i]) {
				answers[i] = w.c.send(ctx, r)
			}
		}()
	}
	wg.Wait()
	return answers
}

// stormCancel: cancel one policy, the request stormed.
func stormCancel(ctx context.Context, w *worker) error {
	p, ok := w.d.takePolicy()
	if !ok {
		return errExhausted
	}
	w.storm(ctx, cancelRequest(p, w.d.customers[p.owner].token, w.newKey()))
	return nil
}

// stormBook: book a random slot, stormed; a winner releases it, stormed too.
func stormBook(ctx context.Context, w *worker) error {
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	a := w.storm(ctx, bookRequest(w.d.slots[w.rng.IntN(len(w.d.slots))], cu.token, w.newKey()))
	if id, ok := createdID(a); ok {
		w.storm(ctx, releaseRequest(id, cu.token, w.newKey()))
	}
	return nil
}

// doubleClickCancel: two keys for one cancellation, at once. The second
// must hear 409 duplicate-intent (or the first's outcome); two
// cancellations started is an anomaly.
func doubleClickCancel(ctx context.Context, w *worker) error {
	p, ok := w.d.takePolicy()
	if !ok {
		return errExhausted
	}
	token := w.d.customers[p.owner].token
	answers := w.together(ctx, cancelRequest(p, token, w.newKey()), cancelRequest(p, token, w.newKey()))
	started := 0
	for _, a := range answers {
		if a.status == http.StatusOK || a.status == http.StatusAccepted {
			started++
		}
	}
	if started > 1 {
		w.rec.anomaly(fmt.Sprintf("policy %d: two keys both started a cancellation (%s, %s)", p.id, answers[0].label(), answers[1].label()))
	}
	return nil
}

// doubleClickBook: one user books one slot twice at once with two keys:
// at most one booking.
func doubleClickBook(ctx context.Context, w *worker) error {
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	slot := w.d.slots[w.rng.IntN(len(w.d.slots))]
	answers := w.together(ctx, bookRequest(slot, cu.token, w.newKey()), bookRequest(slot, cu.token, w.newKey()))
	var won []int64
	for _, a := range answers {
		if id, ok := createdID(a); ok {
			won = append(won, id)
		}
	}
	if len(won) > 1 {
		w.rec.anomaly(fmt.Sprintf("slot %d: two keys both booked it (bookings %v)", slot, won))
	}
	for _, id := range won {
		w.c.send(ctx, releaseRequest(id, cu.token, w.newKey()))
	}
	return nil
}

// raceBook: a random user books a random slot once; a winner holds it for
// up to 10 ms, then releases it.
func raceBook(ctx context.Context, w *worker) error {
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	a := w.c.send(ctx, bookRequest(w.d.slots[w.rng.IntN(len(w.d.slots))], cu.token, w.newKey()))
	if id, ok := createdID(a); ok {
		pause.For(ctx, time.Duration(w.rng.IntN(10))*time.Millisecond)
		w.c.send(ctx, releaseRequest(id, cu.token, w.newKey()))
	}
	return nil
}

// depositBook: a random user books a random deposit slot, stormed (every
// answer for the key must agree, a 202 replayed as stored); a 201 winner
// cancels it — the reverse saga, refund then release — stormed too. 402
// (declined), 409 slot-held and slot-taken are answers, not errors.
//
// A 202 (the charge's outcome unknown) is followed up as a client would:
// the booking is read until the saga ends — recovery finishes it — and a
// confirmed one is cancelled too, so the few slots keep changing hands.
func depositBook(ctx context.Context, w *worker) error {
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	a := w.storm(ctx, bookRequest(w.d.slots[w.rng.IntN(len(w.d.slots))], cu.token, w.newKey()))
	id, ok := createdID(a)
	if !ok && a.status == http.StatusAccepted {
		id, ok = w.awaitConfirmed(ctx, a, cu.token)
	}
	if !ok {
		return nil
	}
	pause.For(ctx, time.Duration(w.rng.IntN(20))*time.Millisecond)
	for range 3 { // a refused refund leaves the booking standing: ask again, new key
		if c := w.storm(ctx, releaseRequest(id, cu.token, w.newKey())); c.status == http.StatusOK || c.status == http.StatusAccepted {
			break
		}
	}
	return nil
}

// awaitConfirmed reads the booking a 202 named until its deposit saga
// ends (bounded), and returns its id when it is CONFIRMED.
func (w *worker) awaitConfirmed(ctx context.Context, a answer, token string) (int64, bool) {
	var b struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	}
	if json.Unmarshal(a.body, &b) != nil || b.ID == 0 {
		return 0, false
	}
	for range 50 {
		pause.For(ctx, 100*time.Millisecond)
		r := w.c.send(ctx, request{method: http.MethodGet, path: fmt.Sprintf("/api/v1/bookings/%d", b.ID), token: token})
		if r.status != http.StatusOK || json.Unmarshal(r.body, &b) != nil {
			return 0, false
		}
		switch b.Status {
		case "CONFIRMED":
			return b.ID, true
		case "FAILED", "CANCELLED":
			return 0, false
		}
	}
	return 0, false
}

// bookFreeSlot: one booking of a slot nobody else wants — the unit bench
// measures against its floor.
func bookFreeSlot(ctx context.Context, w *worker) error {
	slot, ok := w.d.takeSlot()
	if !ok {
		return errExhausted
	}
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	w.c.send(ctx, bookRequest(slot, cu.token, w.newKey()))
	return nil
}

// readLists: what a user's screen loads between actions.
func readLists(ctx context.Context, w *worker) error {
	cu := w.d.customers[w.rng.IntN(len(w.d.customers))]
	w.c.send(ctx, request{method: http.MethodGet, path: "/api/v1/policies?limit=20", token: cu.token})
	w.c.send(ctx, request{method: http.MethodGet, path: "/api/v1/slots?limit=50", token: cu.token})
	return nil
}

// cancelOnce: one cancellation, one request — the unit bench measures.
func cancelOnce(ctx context.Context, w *worker) error {
	p, ok := w.d.takePolicy()
	if !ok {
		return errExhausted
	}
	w.c.send(ctx, cancelRequest(p, w.d.customers[p.owner].token, w.newKey()))
	return nil
}

// replayKeys is how many completed keys the replay workload cycles through.
const replayKeys = 256

// prepareReplay completes replayKeys cancellations, unrecorded, so the
// workload replays keys that exist.
func prepareReplay(ctx context.Context, r *runState) error {
	for range replayKeys {
		p, ok := r.d.takePolicy()
		if !ok {
			break
		}
		req := cancelRequest(p, r.d.customers[p.owner].token, fmt.Sprintf("lt-%s-replay-%d", r.nonce, p.id))
		a := r.c.do(ctx, req)
		if a.err != nil || a.status/100 != 2 {
			return fmt.Errorf("prepare replay: %s %s: %s", req.method, req.path, a.label())
		}
		r.completed = append(r.completed, req)
	}
	if len(r.completed) == 0 {
		return errExhausted
	}
	return nil
}

// replayCompleted sends a completed request again: it must be replayed.
func replayCompleted(ctx context.Context, w *worker) error {
	req := w.run.completed[w.rng.IntN(len(w.run.completed))]
	a := w.c.send(ctx, req)
	if a.err == nil && a.status/100 == 2 && !a.replayed {
		w.rec.anomaly(fmt.Sprintf("key %s: a completed key executed again instead of replaying", req.key))
	}
	return nil
}

// createdID is the id in a 201 answer (a booking).
func createdID(a answer) (int64, bool) {
	if a.status != http.StatusCreated {
		return 0, false
	}
	var v struct {
		ID int64 `json:"id"`
	}
	if json.Unmarshal(a.body, &v) != nil || v.ID == 0 {
		return 0, false
	}
	return v.ID, true
}
