package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemlab/idemlab/internal/testdb"
)

// collector is an OTLP/HTTP trace receiver: every span the child exports,
// by trace id.
type collector struct {
	mu     sync.Mutex
	traces map[string][]string // trace id -> "service: span name"
}

func newCollector(t *testing.T) (*collector, string) {
	c := &collector{traces: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					id := fmt.Sprintf("%x", s.TraceId)
					c.traces[id] = append(c.traces[id], service+": "+s.Name)
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(nil)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func (c *collector) spans(trace string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.traces[trace]...)
}

// One trace links a cancellation's request, the recovery that finishes it
// and each consumer of the event it publishes — across the app, the
// provider and payments, the relay and the consumers (issue 25, item 7).
// The request is abandoned right after the provider applied the
// cancellation, as by a crash; the app's own recovery claims the operation
// when its lease runs out, learns the truth under the step's key, and
// finishes it in the trace stored with that step.
func TestOneTraceLinksRequestRecoveryAndConsumers(t *testing.T) {
	t.Parallel()
	col, colURL := newCollector(t)
	db := testdb.New(t)
	ctx := context.Background()
	_, provURL := externalProvider(t, db)
	child := startChild(t, map[string]string{
		"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "PROVIDER_URL": provURL, "PAYMENTS_ADDR": "127.0.0.1:0",
		"SESSION_SECRET": "s", "LOG_LEVEL": "warn", "DB_MAX_CONNS": "8",
		"PROVIDER_TIMEOUT": "10s", "OPERATION_LEASE": "1s", "IDEMPOTENCY_LEASE": "1s", "RECOVERY_INTERVAL": "100ms",
		"CRASH_AT": "after_provider_call", "CRASH_MODE": "abandon",
		"OTEL_EXPORTER_OTLP_ENDPOINT": colURL, "OTEL_BSP_SCHEDULE_DELAY": "100",
	})
	var policyID int64
	if err := db.Pool.QueryRow(ctx, `SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id WHERE u.name = 'alice' ORDER BY p.id LIMIT 1`).Scan(&policyID); err != nil {
		t.Fatal(err)
	}
	if resp, err := noRedirectClient(nil).Do(mustRequest(t, fmt.Sprintf("%s/api/v1/policies/%d/cancel", child.URL, policyID), "demo-alice", "traced")); err == nil {
		resp.Body.Close()
		t.Fatalf("the abandoned request was answered %d", resp.StatusCode)
	}

	// The step records the request's trace; recovery finishes the operation.
	var trace, status string
	waitFor(t, time.Minute, func() bool {
		var tp *string
		db.Pool.QueryRow(ctx, `
			SELECT s.traceparent, o.status
			  FROM operations o JOIN operation_steps s ON s.operation_id = o.id AND s.name = 'provider_cancel'
			 WHERE o.policy_id = $1`, policyID).Scan(&tp, &status)
		if tp != nil {
			trace = strings.Split(*tp, "-")[1]
		}
		return status == "SUCCEEDED"
	})
	if trace == "" {
		t.Fatal("the provider_cancel step has no traceparent")
	}
	want := []string{
		"idemlab-serve: POST /api/v1/policies/", // the request
		"idemlab-serve: recover operation ",     // recovery, continuing it
		"idemlab-serve: consume policy.cancelled by notifications",
		"idemlab-serve: consume policy.cancelled by ledger",
	}
	var spans []string
	var missing string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		spans, missing = col.spans(trace), ""
		for _, w := range want {
			found := false
			for _, s := range spans {
				found = found || strings.HasPrefix(s, w)
			}
			if !found {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s has no span %q; it has %q", trace, missing, spans)
		}
	}
	// The calls to the provider carried it too: a client span per call.
	var calls int
	for _, s := range spans {
		if strings.HasPrefix(s, "idemlab-serve: HTTP POST") || strings.HasPrefix(s, "idemlab-serve: HTTP GET") {
			calls++
		}
	}
	if calls < 2 { // the cancellation's call, recovery's status query
		t.Errorf("%d client spans in the trace, want the call and the status query: %q", calls, spans)
	}
}
