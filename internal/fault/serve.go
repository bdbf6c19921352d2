package fault

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// Calls is how every fake serves its business API: the same steps for a
// cancellation, a charge or a refund, with the fake's own state plugged in.
type Calls struct {
	Store  *Store
	Holder *Holder
	Log    *slog.Logger
}

// Record is a fake's record of a key after a call, as the caller is answered.
type Record struct {
	Key    string
	Truth  external.Truth
	Reason string // why it was refused
	// UntilComplete is how long a RUNNING key still has to go.
	UntilComplete time.Duration
}

// Receive processes one call in the fake's own state (fault.Process inside
// one transaction) and returns the key's record afterwards.
type Receive func(ctx context.Context, call Call) (Record, error)

// Serve carries one mutating call, already read (ReadCall) and checked, to
// its answer:
//
//  1. Arrive: a call after its deadline is answered 408 and goes no further;
//     otherwise the governing fault is drawn.
//  2. drop holds the connection and records nothing; error answers 503 and
//     records nothing.
//  3. receive records and applies it (the fake's SQL); a key reused for
//     another subject is 409.
//  4. lost_response holds the connection after the commit; slow holds it
//     until the work completes, then re-reads the record (reread).
//  5. latency_ms, then 200 COMPLETED, 202 RUNNING or 422 REJECTED.
//
// Once a call has arrived it is processed to the end whether or not the
// caller stays, as a real server would: the database work uses a context
// detached from the caller's connection.
func (c Calls) Serve(w http.ResponseWriter, r *http.Request, a Arrival, receive Receive, reread func(ctx context.Context) (Record, error)) {
	ctx, cancel := Detached(r)
	defer cancel()

	f, err := c.Store.Arrive(ctx, a)
	var late *LateError
	if errors.As(err, &late) {
		WriteLate(w, late) // recorded; nothing applied
		return
	}
	if err != nil {
		InternalError(c.Log, w, err)
		return
	}
	switch f.Mode {
	case ModeDrop:
		c.Holder.Hold(r) // the request never arrived: nothing is recorded
		return
	case ModeError:
		if !c.Holder.Wait(r.Context(), f.Latency) {
			Abort()
		}
		WriteError(w, http.StatusServiceUnavailable, "unavailable", "the system is temporarily unavailable; nothing was done")
		return
	}

	rec, err := receive(ctx, f)
	if errors.Is(err, ErrKeyReused) {
		WriteError(w, http.StatusConflict, "key_reused", "this Idempotency-Key was used for another request")
		return
	}
	if err != nil {
		InternalError(c.Log, w, err)
		return
	}
	switch {
	case f.Mode == ModeLostResponse:
		c.Holder.Hold(r) // processed and committed; the answer never leaves
		return
	case f.Mode == ModeSlow && rec.Truth == external.TruthRunning:
		// The fake answers when the work is done. A caller with a shorter
		// timeout gives up first and is left not knowing.
		if !c.Holder.Wait(r.Context(), rec.UntilComplete) {
			Abort()
		}
		if rec, err = reread(ctx); err != nil {
			InternalError(c.Log, w, err)
			return
		}
	}
	if !c.Holder.Wait(r.Context(), f.Latency) {
		Abort()
	}
	WriteRecord(w, rec)
}

// WriteRecord answers with a key's truth: 200 COMPLETED, 202 RUNNING (a
// repeat of a key still running), 422 REJECTED with the reason.
func WriteRecord(w http.ResponseWriter, rec Record) {
	status := http.StatusOK
	switch rec.Truth {
	case external.TruthRunning:
		status = http.StatusAccepted
	case external.TruthRejected:
		status = http.StatusUnprocessableEntity
	}
	WriteJSON(w, status, struct {
		Key    string         `json:"key"`
		Status external.Truth `json:"status"`
		Reason string         `json:"reason,omitempty"`
	}{rec.Key, rec.Truth, rec.Reason})
}

// Lookup reads a key's full record for a status answer: found is false for
// a key the fake never processed.
type Lookup func(ctx context.Context, key string) (answer any, found bool, err error)

// ServeStatus answers GET …/{key}: 200 with the record, 404 with
// NOT_STARTED for a key the fake never processed. The global status_mode
// can make it fail (503) or never answer, and latency_ms delays it.
func (c Calls) ServeStatus(w http.ResponseWriter, r *http.Request, lookup Lookup) {
	key := r.PathValue("key")
	if !external.ValidKey(key) {
		WriteError(w, http.StatusBadRequest, "invalid_request", "the key must be 1 to 255 visible ASCII characters")
		return
	}
	ctx, cancel := Detached(r)
	defer cancel()
	mode, latency, err := c.Store.StatusFault(ctx)
	if err != nil {
		InternalError(c.Log, w, err)
		return
	}
	switch mode {
	case StatusDrop:
		c.Holder.Hold(r)
		return
	case StatusError:
		if !c.Holder.Wait(r.Context(), latency) {
			Abort()
		}
		WriteError(w, http.StatusServiceUnavailable, "unavailable", "the system is temporarily unavailable")
		return
	}
	answer, found, err := lookup(ctx, key)
	if err != nil {
		InternalError(c.Log, w, err)
		return
	}
	if !c.Holder.Wait(r.Context(), latency) {
		Abort()
	}
	if !found {
		WriteJSON(w, http.StatusNotFound, struct {
			Key    string         `json:"key"`
			Status external.Truth `json:"status"`
		}{key, external.TruthNotStarted})
		return
	}
	WriteJSON(w, http.StatusOK, answer)
}
