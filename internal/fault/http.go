package fault

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// This file is what every fake's HTTP API shares: reading a keyed call,
// holding a connection without answering, and the JSON in and out.

// maxBody bounds a request body; every call and fault is a few hundred bytes.
const maxBody = 64 << 10

// Holder keeps requests open without answering them — the only honest way to
// stage a timeout — and lets them all go at once when the fake closes.
type Holder struct {
	cap       time.Duration
	closing   chan struct{} // closed by Close: releases every held request
	closeOnce sync.Once
}

// NewHolder returns a Holder that never holds a request longer than cap
// (default 2 minutes), even when its caller never gives up.
func NewHolder(cap time.Duration) *Holder {
	if cap <= 0 {
		cap = 2 * time.Minute
	}
	return &Holder{cap: cap, closing: make(chan struct{})}
}

// Close releases every request being held, and any held from now on: each
// connection is aborted without an answer, as a crashing server would leave
// it. Call it before shutting the HTTP server down, whose graceful Shutdown
// would otherwise wait for held requests. Close is idempotent.
func (h *Holder) Close() { h.closeOnce.Do(func() { close(h.closing) }) }

// Hold keeps r open and never answers it: it waits until the caller gives up
// (closing the connection ends r.Context()), the fake closes, or the cap
// passes, then aborts the connection. No status line ever leaves, so the
// caller's only experience is its own timeout — nothing is staged with a
// special status.
func (h *Holder) Hold(r *http.Request) {
	h.Wait(r.Context(), h.cap)
	Abort()
}

// Wait sleeps for d and reports whether it elapsed; false means the caller
// gave up or the fake is closing, and the caller of Wait must then Abort
// rather than answer.
func (h *Holder) Wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-h.closing:
		return false
	}
}

// Abort ends the handler and drops the connection without an answer.
// http.ErrAbortHandler is net/http's way to do that; the server recovers it
// silently. Without it, a handler that returns unanswered sends 200.
func Abort() { panic(http.ErrAbortHandler) }

// Detached returns a context for a fake's own work on r: not cancelled when
// the caller leaves (a server finishes what it received, as a real one
// would), but bounded.
func Detached(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
}

// ReadCall reads a keyed, mutating call: its Idempotency-Key, its
// Request-Deadline (zero when it carries none: a person with curl) and its
// JSON body into body. It answers 400 itself and returns false when any of
// them is unreadable. The whole body is read before anything is decided,
// so a call held in the network is judged when its last byte gets in.
func ReadCall(w http.ResponseWriter, r *http.Request, body any) (key string, deadline time.Time, ok bool) {
	key = r.Header.Get("Idempotency-Key")
	if !external.ValidKey(key) {
		WriteError(w, http.StatusBadRequest, "invalid_request", "Idempotency-Key must be 1 to 255 visible ASCII characters")
		return "", time.Time{}, false
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_request", "the body could not be read")
		return "", time.Time{}, false
	}
	deadline, _, err = external.RequestDeadline(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return "", time.Time{}, false
	}
	if err := json.Unmarshal(raw, body); err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_request", "the body must be a JSON object")
		return "", time.Time{}, false
	}
	return key, deadline, true
}

// WriteLate answers a call refused for arriving after its deadline: 408
// deadline_passed. The caller that set the deadline has stopped waiting by
// then (unless clocks disagree); the refusal is for the ledger and for
// anyone who reads the answer.
func WriteLate(w http.ResponseWriter, late *LateError) {
	WriteJSON(w, http.StatusRequestTimeout, struct {
		Error     string    `json:"error"`
		Message   string    `json:"message"`
		Key       string    `json:"key"`
		Deadline  time.Time `json:"deadline"`
		ArrivedAt time.Time `json:"arrived_at"`
		LateMS    int64     `json:"late_ms"`
	}{"deadline_passed", late.Error(), late.Key, late.Deadline, late.ArrivedAt, late.Late().Milliseconds()})
}

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the caller may be gone; nothing to do about it
}

// ErrorBody is the JSON of every error a fake's API answers.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// Field names the offending field of a refused fault setting.
	Field string `json:"field,omitempty"`
}

// WriteError answers {"error": code, "message": message} with status.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	WriteJSON(w, status, ErrorBody{Error: code, Message: message})
}

// InternalError logs err and answers a bare 500.
func InternalError(log *slog.Logger, w http.ResponseWriter, err error) {
	log.Error("fake", "err", err)
	WriteError(w, http.StatusInternalServerError, "internal", "the system failed")
}

// ControlAPI serves what every fake's control surface shares:
//
//	GET  /v1/faults   the fault configuration
//	PUT  /v1/faults   set one fault (global, override or script entry)
//	POST /v1/reset    forget everything, restore the defaults
//
// Each fake adds its own ledger route behind the same Access.
type ControlAPI struct {
	Store *Store
	// Reset forgets the fake's own state and calls Store.Reset, in one transaction.
	Reset func(ctx context.Context) error
	Log   *slog.Logger
}

// Register adds the control routes to mux, each behind access.
func (c ControlAPI) Register(mux *http.ServeMux, access Access) {
	mux.HandleFunc("GET /v1/faults", access.Guard(c.handleGetFaults))
	mux.HandleFunc("PUT /v1/faults", access.Guard(c.handlePutFaults))
	mux.HandleFunc("POST /v1/reset", access.Guard(c.handleReset))
}

func (c ControlAPI) handleGetFaults(w http.ResponseWriter, r *http.Request) {
	cfg, err := c.Store.Config(r.Context())
	if err != nil {
		InternalError(c.Log, w, err)
		return
	}
	WriteJSON(w, http.StatusOK, cfg)
}

// handlePutFaults: 200 with the new configuration · 415 for a body that is
// not JSON · 400 for JSON that is not one fault (unknown fields included) ·
// 422 invalid_fault with the field for a value out of range.
func (c ControlAPI) handlePutFaults(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "send the fault as application/json")
			return
		}
	}
	var f Fault
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		err = json.Unmarshal(raw, &f) // Fault.UnmarshalJSON: over the defaults, strict
	}
	var invalid *InvalidError
	if err != nil && !errors.As(err, &invalid) {
		WriteError(w, http.StatusBadRequest, "invalid_json", "the body must be one fault object: "+err.Error())
		return
	}
	var cfg Config
	if err == nil {
		cfg, err = c.Store.Set(r.Context(), f)
	}
	switch {
	case errors.As(err, &invalid):
		WriteJSON(w, http.StatusUnprocessableEntity, ErrorBody{Error: "invalid_fault", Field: invalid.Field, Message: invalid.Message})
	case err != nil:
		InternalError(c.Log, w, err)
	default:
		WriteJSON(w, http.StatusOK, cfg)
	}
}

func (c ControlAPI) handleReset(w http.ResponseWriter, r *http.Request) {
	if err := c.Reset(r.Context()); err != nil {
		InternalError(c.Log, w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
