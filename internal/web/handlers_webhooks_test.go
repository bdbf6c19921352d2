package web

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/webhook"
	"github.com/idemlab/idemlab/internal/workflow"
)

// The webhook route's hostile cases: each refusal is a precise problem,
// counted, and writes nothing; a genuine callback is received once.
func TestWebhookRouteRefusesForgedStaleAndMalformedCallbacks(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	secret := []byte("shared-secret")
	reg := prometheus.NewRegistry()
	app := New(Config{BodyLimit: "1M"}, Deps{
		Logger:        slog.New(slog.DiscardHandler),
		Pool:          db.Pool,
		Registry:      reg,
		Engine:        workflow.NewEngine(db.Pool, workflow.Config{}),
		WebhookSecret: secret,
	})
	h := app.routes()
	now := time.Now()
	event := func(id string) []byte {
		b, _ := json.Marshal(webhook.Event{ID: id, Key: "404:provider_cancel", Status: "COMPLETED", OccurredAt: now, Attempt: 1})
		return b
	}
	send := func(system string, body []byte, sign func(http.Header)) (int, string, string) {
		req := httptest.NewRequest(http.MethodPost, "/webhooks/"+system, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		if sign != nil {
			sign(req.Header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var p struct{ Type, Outcome string }
		raw, _ := io.ReadAll(rec.Body)
		_ = json.Unmarshal(raw, &p)
		return rec.Code, p.Type, p.Outcome
	}
	oversized := []byte(`{"id":"e1","key":"404:provider_cancel","status":"COMPLETED","attempt":1,"reason":"` + strings.Repeat("x", 64<<10) + `"}`)
	signed := func(id string, at time.Time, body []byte, key []byte) func(http.Header) {
		return func(hd http.Header) { webhook.SetHeaders(hd, key, id, at, body) }
	}
	for _, c := range []struct {
		name   string
		system string
		body   []byte
		sign   func(http.Header)
		status int
		typ    string
		metric string
	}{
		{"unknown system", "bank", event("e1"), signed("e1", now, event("e1"), secret), 404, "not-found", "refused_system"},
		{"unsigned", "provider", event("e1"), nil, 400, "webhook-unsigned", "refused_missing"},
		{"oversized: signed, but 64 KiB of reason", "provider", oversized, signed("e1", now, oversized, secret), 413, "body-too-large", "refused_oversized"},
		{"forged: another secret", "provider", event("e1"), signed("e1", now, event("e1"), []byte("guess")), 401, "webhook-signature", "refused_signature"},
		{"forged: body changed after signing", "provider", event("e2"), signed("e1", now, event("e1"), secret), 401, "webhook-signature", "refused_signature"},
		{"stale: signed 10 minutes ago (a replay)", "provider", event("e1"), signed("e1", now.Add(-10*time.Minute), event("e1"), secret), 401, "webhook-stale", "refused_stale"},
		{"from the future", "provider", event("e1"), signed("e1", now.Add(time.Hour), event("e1"), secret), 401, "webhook-stale", "refused_stale"},
		{"body id is not the signed id", "provider", event("e2"), signed("e1", now, event("e2"), secret), 422, "webhook-invalid", "refused_invalid"},
		{"not JSON", "provider", []byte("{"), signed("e1", now, []byte("{"), secret), 422, "webhook-invalid", "refused_invalid"},
		{"unknown field", "provider", []byte(`{"id":"e1","key":"k","status":"COMPLETED","attempt":1,"x":1}`),
			signed("e1", now, []byte(`{"id":"e1","key":"k","status":"COMPLETED","attempt":1,"x":1}`), secret), 422, "webhook-invalid", "refused_invalid"},
		{"unknown status", "provider", []byte(`{"id":"e1","key":"k","status":"DONE","attempt":1}`),
			signed("e1", now, []byte(`{"id":"e1","key":"k","status":"DONE","attempt":1}`), secret), 422, "webhook-invalid", "refused_invalid"},
	} {
		status, typ, _ := send(c.system, c.body, c.sign)
		if status != c.status || typ != c.typ {
			t.Errorf("%s: %d %s, want %d %s", c.name, status, typ, c.status, c.typ)
		}
		var rows int
		db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_inbox`).Scan(&rows)
		if rows != 0 {
			t.Fatalf("%s: wrote %d inbox rows", c.name, rows)
		}
		if c.metric != "" && counted(t, reg, c.metric) == 0 {
			t.Errorf("%s: not counted as %s", c.name, c.metric)
		}
	}
	// Genuine, for a key no step has: kept for a person; its copy a duplicate.
	for i, want := range []string{"unknown_step", "duplicate"} {
		status, _, outcome := send("provider", event("e9"), signed("e9", now, event("e9"), secret))
		if status != 200 || outcome != want {
			t.Fatalf("copy %d: %d %q, want 200 %s", i+1, status, outcome, want)
		}
	}
}

// counted is idemlab_callbacks_total{outcome} summed over systems.
func counted(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != "idemlab_callbacks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
