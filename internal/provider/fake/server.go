package fake

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/provider"
)

// Options tune a Provider. The zero value is ready to use.
type Options struct {
	// HoldCap bounds how long a request the provider never answers (drop,
	// lost_response, a slow call, a dropped status query) stays open when its
	// caller does not give up. Default 2 minutes.
	HoldCap time.Duration
	// Logger receives the provider's own failures (database errors). Default
	// slog.Default().
	Logger *slog.Logger
}

// Provider is the fake provider: its HTTP API over its durable state in the
// fake_provider schema. Several Providers (processes, replicas) on one
// database are one provider.
type Provider struct {
	pool    *pgxpool.Pool
	holdCap time.Duration
	log     *slog.Logger

	closing   chan struct{} // closed by Close: releases every held request
	closeOnce sync.Once
}

// New returns a Provider keeping its state in pool's database, which must be
// migrated (migrations/00003_fake_provider.sql).
func New(pool *pgxpool.Pool, opts Options) *Provider {
	if opts.HoldCap <= 0 {
		opts.HoldCap = 2 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Provider{pool: pool, holdCap: opts.HoldCap, log: opts.Logger, closing: make(chan struct{})}
}

// Close releases every request the provider is holding, and any it would
// hold from now on: each connection is aborted without an answer, as a
// crashing provider would leave it. Call it before shutting the HTTP server
// down, whose graceful Shutdown would otherwise wait for held requests.
// Close is idempotent.
func (p *Provider) Close() { p.closeOnce.Do(func() { close(p.closing) }) }

// Handler returns the provider's HTTP API:
//
//	POST /v1/cancellations        cancel a policy (Idempotency-Key header)
//	GET  /v1/cancellations/{key}  the truth of a key
//	GET  /v1/effects              the effects ledger, summed per policy
//	GET  /v1/faults               the fault configuration
//	PUT  /v1/faults               set one fault (global, override or script)
//	POST /v1/reset                forget everything, restore the defaults
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/cancellations", p.handleCancel)
	mux.HandleFunc("GET /v1/cancellations/{key}", p.handleStatus)
	mux.HandleFunc("GET /v1/effects", p.handleEffects)
	mux.HandleFunc("GET /v1/faults", p.handleGetFaults)
	mux.HandleFunc("PUT /v1/faults", p.handlePutFaults)
	mux.HandleFunc("POST /v1/reset", p.handleReset)
	return mux
}

// answer is the JSON of every cancellation and status answer.
type answer struct {
	Key         string         `json:"key"`
	Status      provider.Truth `json:"status"`
	Reason      string         `json:"reason,omitempty"`
	PolicyID    int64          `json:"policy_id,omitempty"`
	Attempts    int            `json:"attempts,omitempty"`
	ReceivedAt  *time.Time     `json:"received_at,omitempty"`
	CompletesAt *time.Time     `json:"completes_at,omitempty"`
}

// handleCancel is POST /v1/cancellations. The fault decides what happens;
// see the table in doc.go.
func (p *Provider) handleCancel(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if !provider.ValidKey(key) {
		writeError(w, http.StatusBadRequest, "invalid_request", "Idempotency-Key must be 1 to 255 visible ASCII characters")
		return
	}
	var body struct {
		PolicyID int64  `json:"policy_id"`
		Reason   string `json:"reason"`
	}
	if err := readJSON(w, r, &body); err != nil || body.PolicyID <= 0 {
		writeError(w, http.StatusBadRequest, "invalid_request", `body must be {"policy_id": <positive id>, "reason": "…"}`)
		return
	}

	// Once a request has arrived, the provider finishes processing it
	// whether or not the caller is still waiting, as a real server would:
	// its database work does not die with the caller's connection.
	ctx, cancel := detached(r)
	defer cancel()

	fault, err := p.resolveFault(ctx, body.PolicyID)
	if err != nil {
		p.internalError(w, err)
		return
	}
	switch fault.mode {
	case ModeDrop:
		p.hold(r) // the request never arrived: nothing is recorded
		return
	case ModeError:
		if !p.wait(r.Context(), fault.latency) {
			abort()
		}
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the provider is temporarily unavailable; nothing was done")
		return
	}

	rec, err := p.receive(ctx, call{key: key, policyID: body.PolicyID, reason: body.Reason, fault: fault})
	if errors.Is(err, errKeyReused) {
		writeError(w, http.StatusConflict, "key_reused", "this Idempotency-Key was used for another policy")
		return
	}
	if err != nil {
		p.internalError(w, err)
		return
	}

	switch {
	case fault.mode == ModeLostResponse:
		p.hold(r) // processed and committed; the answer never leaves
		return
	case fault.mode == ModeSlow && rec.Truth == provider.TruthRunning:
		// The provider answers when the work is done. A caller with a
		// shorter timeout gives up first and is left not knowing.
		if !p.wait(r.Context(), rec.untilComplete) {
			abort()
		}
		if rec, err = readRequest(ctx, p.pool, key, nil); err != nil {
			p.internalError(w, err)
			return
		}
	}
	if !p.wait(r.Context(), fault.latency) {
		abort()
	}
	p.writeRecord(w, rec)
}

// writeRecord answers with a key's truth: 200 COMPLETED, 202 RUNNING (a
// repeat of a key still running), 422 REJECTED.
func (p *Provider) writeRecord(w http.ResponseWriter, rec request) {
	status := http.StatusOK
	switch rec.Truth {
	case provider.TruthRunning:
		status = http.StatusAccepted
	case provider.TruthRejected:
		status = http.StatusUnprocessableEntity
	}
	writeJSON(w, status, answer{Key: rec.Key, Status: rec.Truth, Reason: rec.RejectReason})
}

// handleStatus is GET /v1/cancellations/{key}: 200 with the truth, 404 with
// NOT_STARTED for a key the provider never processed. The global
// status_mode can make it fail (503) or never answer.
func (p *Provider) handleStatus(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !provider.ValidKey(key) {
		writeError(w, http.StatusBadRequest, "invalid_request", "the key must be 1 to 255 visible ASCII characters")
		return
	}
	ctx, cancel := detached(r)
	defer cancel()
	mode, latency, err := p.statusFault(ctx)
	if err != nil {
		p.internalError(w, err)
		return
	}
	switch mode {
	case StatusDrop:
		p.hold(r)
		return
	case StatusError:
		if !p.wait(r.Context(), latency) {
			abort()
		}
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the provider is temporarily unavailable")
		return
	}
	rec, err := readRequest(ctx, p.pool, key, nil)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		p.internalError(w, err)
		return
	}
	if !p.wait(r.Context(), latency) {
		abort()
	}
	if err != nil { // pgx.ErrNoRows
		writeJSON(w, http.StatusNotFound, answer{Key: key, Status: provider.TruthNotStarted})
		return
	}
	writeJSON(w, http.StatusOK, answer{
		Key: rec.Key, Status: rec.Truth, Reason: rec.RejectReason, PolicyID: rec.PolicyID,
		Attempts: rec.Attempts, ReceivedAt: &rec.ReceivedAt, CompletesAt: &rec.CompletesAt,
	})
}

// handleEffects is GET /v1/effects.
func (p *Provider) handleEffects(w http.ResponseWriter, r *http.Request) {
	e, err := p.Effects(r.Context())
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// handleGetFaults is GET /v1/faults.
func (p *Provider) handleGetFaults(w http.ResponseWriter, r *http.Request) {
	cfg, err := p.Faults(r.Context())
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, cfg)
}

// handlePutFaults is PUT /v1/faults: 200 with the new configuration, 400
// for an invalid fault.
func (p *Provider) handlePutFaults(w http.ResponseWriter, r *http.Request) {
	var f Fault
	if err := readJSON(w, r, &f); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_fault", err.Error())
		return
	}
	cfg, err := p.SetFaults(r.Context(), f)
	if errors.Is(err, ErrInvalidFault) {
		writeError(w, http.StatusBadRequest, "invalid_fault", strings.TrimPrefix(err.Error(), ErrInvalidFault.Error()+": "))
		return
	}
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, cfg)
}

// handleReset is POST /v1/reset: 204.
func (p *Provider) handleReset(w http.ResponseWriter, r *http.Request) {
	if err := p.Reset(r.Context()); err != nil {
		p.internalError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// hold keeps a request open and never answers it: it waits until the caller
// gives up (closing the connection ends r.Context()), the provider closes,
// or HoldCap passes, then aborts the connection. No status line ever
// leaves, so the caller's only experience is its own timeout — nothing is
// staged with a special status.
func (p *Provider) hold(r *http.Request) {
	p.wait(r.Context(), p.holdCap)
	abort()
}

// abort ends the handler and drops the connection without an answer.
// http.ErrAbortHandler is net/http's way to do that; the server recovers
// it silently. Without it, a handler that returns unanswered sends 200.
func abort() { panic(http.ErrAbortHandler) }

// wait sleeps for d and reports whether it elapsed; false means the caller
// gave up or the provider is closing, and the caller of wait must then
// abort rather than answer.
func (p *Provider) wait(ctx context.Context, d time.Duration) bool {
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
	case <-p.closing:
		return false
	}
}

// detached returns a context for the provider's own work on r: not
// cancelled when the caller leaves, but bounded.
func detached(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
}

// readJSON reads the whole body (so net/http can notice when the caller
// hangs up while the request is held) and decodes it into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the caller may be gone; nothing to do about it
}

// errorBody is the JSON of every error the provider's API answers.
type errorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorBody{Error: code, Message: message})
}

func (p *Provider) internalError(w http.ResponseWriter, err error) {
	p.log.Error("fake provider", "err", err)
	writeError(w, http.StatusInternalServerError, "internal", "the provider failed")
}
