package fake

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider"
)

// Options tune a Provider: HoldCap, Logger and Control (who may use the
// control API; the zero value admits loopback callers only). The zero value
// is ready to use.
type Options = fault.Options

// Provider is the fake provider: its HTTP API over its durable state in the
// fake_provider schema, and its faults in the shared fault schema (system
// 'provider'). Several Providers (processes, replicas) on one database are
// one provider. Close, Faults, SetFaults and Reset are fault.Service's.
type Provider struct {
	fault.Service
}

// New returns a Provider keeping its state in pool's database, which must be
// migrated (migrations/00003_fake_provider.sql, 00020_fault.sql). Give it a
// pool of its own: an external system shares nothing with the app but the
// database server.
func New(pool *pgxpool.Pool, opts Options) *Provider {
	return &Provider{fault.NewService(pool, "provider", []string{"policy"}, []string{
		`DELETE FROM fake_provider.effects`,
		`DELETE FROM fake_provider.requests`,
		webhooks.Forget(),
	}, opts)}
}

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
//	GET  /v1/webhooks             the callback setting and the webhook outbox
//	PUT  /v1/webhooks             set how callbacks are sent (fault.WebhookSettings)
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/cancellations", p.handleCancel)
	mux.HandleFunc("GET /v1/cancellations/{key}", p.handleStatus)
	p.Register(mux, "/v1/effects", p.handleEffects)
	fault.WebhookAPI{Service: p.Service, Outbox: webhooks}.Register(mux)
	return mux
}

// Webhooks is the provider's webhook outbox, for its sender.
func (p *Provider) Webhooks() fault.Outbox { return webhooks }

// statusAnswer is the JSON of a status answer.
type statusAnswer struct {
	Key         string         `json:"key"`
	Status      provider.Truth `json:"status"`
	Reason      string         `json:"reason,omitempty"`
	PolicyID    int64          `json:"policy_id"`
	Attempts    int            `json:"attempts"`
	ReceivedAt  time.Time      `json:"received_at"`
	CompletesAt time.Time      `json:"completes_at"`
}

// handleCancel is POST /v1/cancellations: read the call, then the steps
// every fake shares (fault.Calls.Serve): a call arriving after its
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
	if body.PolicyID <= 0 || body.PolicyID > fault.MaxID {
		fault.WriteError(w, http.StatusBadRequest, "invalid_request", `body must be {"policy_id": <positive id>, "reason": "…"}`)
		return
	}
	p.Calls.Serve(w, r, fault.Arrival{Key: key, Subject: fault.Policy(body.PolicyID), Deadline: deadline},
		func(ctx context.Context, f fault.Call) (fault.Record, error) {
			rec, err := p.receive(ctx, call{key: key, policyID: body.PolicyID, reason: body.Reason, fault: f})
			return rec.record(), err
		},
		func(ctx context.Context) (fault.Record, error) {
			rec, err := readRequest(ctx, p.Pool, key, nil)
			return rec.record(), err
		})
}

// handleStatus is GET /v1/cancellations/{key}: 200 with the truth, 404 with
// NOT_STARTED for a key the provider never processed (fault.Calls.ServeStatus).
func (p *Provider) handleStatus(w http.ResponseWriter, r *http.Request) {
	p.Calls.ServeStatus(w, r, func(ctx context.Context, key string) (any, bool, error) {
		rec, err := readRequest(ctx, p.Pool, key, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, nil
		}
		return statusAnswer{
			Key: rec.Key, Status: rec.Truth, Reason: rec.RejectReason, PolicyID: rec.PolicyID,
			Attempts: rec.Attempts, ReceivedAt: rec.ReceivedAt, CompletesAt: rec.CompletesAt,
		}, err == nil, err
	})
}

// handleEffects is GET /v1/effects.
func (p *Provider) handleEffects(w http.ResponseWriter, r *http.Request) {
	e, err := p.Effects(r.Context())
	if err != nil {
		fault.InternalError(p.Log, w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, e)
}
