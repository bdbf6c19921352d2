package fake

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/fault"
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
	// Control says who may use the control API (faults, effects, reset).
	// The zero value admits loopback callers only.
	Control fault.Access
}

// Provider is the fake provider: its HTTP API over its durable state in the
// fake_provider schema, and its faults in the shared fault schema. Several
// Providers (processes, replicas) on one database are one provider.
type Provider struct {
	pool    *pgxpool.Pool
	faults  *fault.Store
	holder  *fault.Holder
	log     *slog.Logger
	control fault.Access
}

// New returns a Provider keeping its state in pool's database, which must be
// migrated (migrations/00003_fake_provider.sql, 00020_fault.sql). Give it a
// pool of its own: an external system shares nothing with the app but the
// database server.
func New(pool *pgxpool.Pool, opts Options) *Provider {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Provider{
		pool:    pool,
		faults:  fault.NewStore(pool, "provider", "policy"),
		holder:  fault.NewHolder(opts.HoldCap),
		log:     opts.Logger,
		control: opts.Control,
	}
}

// Close releases every request the provider is holding, and any it would
// hold from now on: each connection is aborted without an answer, as a
// crashing provider would leave it. Call it before shutting the HTTP server
// down, whose graceful Shutdown would otherwise wait for held requests.
// Close is idempotent.
func (p *Provider) Close() { p.holder.Close() }

// Handler returns the provider's HTTP API:
//
//	POST /v1/cancellations        cancel a policy (Idempotency-Key, Request-Deadline)
//	GET  /v1/cancellations/{key}  the truth of a key
//
// and its control API, behind Options.Control:
//
//	GET  /v1/effects              the effects ledger, summed per policy, and the late arrivals
//	GET  /v1/faults               the fault configuration
//	PUT  /v1/faults               set one fault (global, override or script)
//	POST /v1/reset                forget everything, restore the defaults
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/cancellations", p.handleCancel)
	mux.HandleFunc("GET /v1/cancellations/{key}", p.handleStatus)
	mux.HandleFunc("GET /v1/effects", p.control.Guard(p.handleEffects))
	fault.ControlAPI{Store: p.faults, Reset: p.Reset, Log: p.log}.Register(mux, p.control)
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

// handleCancel is POST /v1/cancellations. A call that arrives after its
// Request-Deadline is refused (408) before anything else; otherwise the
// fault decides what happens; see the table in doc.go.
func (p *Provider) handleCancel(w http.ResponseWriter, r *http.Request) {
	var body struct {
		PolicyID int64  `json:"policy_id"`
		Reason   string `json:"reason"`
	}
	key, deadline, ok := fault.ReadCall(w, r, &body)
	if !ok {
		return
	}
	if body.PolicyID <= 0 {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request", `body must be {"policy_id": <positive id>, "reason": "…"}`)
		return
	}

	// Once a request has arrived, the provider finishes processing it
	// whether or not the caller is still waiting, as a real server would:
	// its database work does not die with the caller's connection.
	ctx, cancel := fault.Detached(r)
	defer cancel()

	f, err := p.faults.Arrive(ctx, fault.Arrival{Key: key, Subject: fault.Policy(body.PolicyID), Deadline: deadline})
	var late *fault.LateError
	if errors.As(err, &late) {
		fault.WriteLate(w, late) // recorded; nothing applied
		return
	}
	if err != nil {
		fault.InternalError(p.log, w, err)
		return
	}
	switch f.Mode {
	case ModeDrop:
		p.holder.Hold(r) // the request never arrived: nothing is recorded
		return
	case ModeError:
		if !p.holder.Wait(r.Context(), f.Latency) {
			fault.Abort()
		}
		fault.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the provider is temporarily unavailable; nothing was done")
		return
	}

	rec, err := p.receive(ctx, call{key: key, policyID: body.PolicyID, reason: body.Reason, fault: f})
	if errors.Is(err, errKeyReused) {
		fault.WriteError(w, http.StatusConflict, "key_reused", "this Idempotency-Key was used for another policy")
		return
	}
	if err != nil {
		fault.InternalError(p.log, w, err)
		return
	}

	switch {
	case f.Mode == ModeLostResponse:
		p.holder.Hold(r) // processed and committed; the answer never leaves
		return
	case f.Mode == ModeSlow && rec.Truth == provider.TruthRunning:
		// The provider answers when the work is done. A caller with a
		// shorter timeout gives up first and is left not knowing.
		if !p.holder.Wait(r.Context(), rec.untilComplete) {
			fault.Abort()
		}
		if rec, err = readRequest(ctx, p.pool, key, nil); err != nil {
			fault.InternalError(p.log, w, err)
			return
		}
	}
	if !p.holder.Wait(r.Context(), f.Latency) {
		fault.Abort()
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
	fault.WriteJSON(w, status, answer{Key: rec.Key, Status: rec.Truth, Reason: rec.RejectReason})
}

// handleStatus is GET /v1/cancellations/{key}: 200 with the truth, 404 with
// NOT_STARTED for a key the provider never processed. The global
// status_mode can make it fail (503) or never answer.
func (p *Provider) handleStatus(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if !provider.ValidKey(key) {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request", "the key must be 1 to 255 visible ASCII characters")
		return
	}
	ctx, cancel := fault.Detached(r)
	defer cancel()
	mode, latency, err := p.faults.StatusFault(ctx)
	if err != nil {
		fault.InternalError(p.log, w, err)
		return
	}
	switch mode {
	case StatusDrop:
		p.holder.Hold(r)
		return
	case StatusError:
		if !p.holder.Wait(r.Context(), latency) {
			fault.Abort()
		}
		fault.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the provider is temporarily unavailable")
		return
	}
	rec, err := readRequest(ctx, p.pool, key, nil)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		fault.InternalError(p.log, w, err)
		return
	}
	if !p.holder.Wait(r.Context(), latency) {
		fault.Abort()
	}
	if err != nil { // pgx.ErrNoRows
		fault.WriteJSON(w, http.StatusNotFound, answer{Key: key, Status: provider.TruthNotStarted})
		return
	}
	fault.WriteJSON(w, http.StatusOK, answer{
		Key: rec.Key, Status: rec.Truth, Reason: rec.RejectReason, PolicyID: rec.PolicyID,
		Attempts: rec.Attempts, ReceivedAt: &rec.ReceivedAt, CompletesAt: &rec.CompletesAt,
	})
}

// handleEffects is GET /v1/effects.
func (p *Provider) handleEffects(w http.ResponseWriter, r *http.Request) {
	e, err := p.Effects(r.Context())
	if err != nil {
		fault.InternalError(p.log, w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, e)
}

// Faults returns the whole fault configuration.
func (p *Provider) Faults(ctx context.Context) (Config, error) { return p.faults.Config(ctx) }

// SetFaults applies one fault setting and returns the resulting
// configuration (see fault.Store.Set). An invalid fault returns a
// *fault.InvalidError naming the field and changes nothing.
func (p *Provider) SetFaults(ctx context.Context, f Fault) (Config, error) {
	return p.faults.Set(ctx, f)
}
