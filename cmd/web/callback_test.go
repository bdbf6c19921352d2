package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// The whole callback path in one program: the provider applies the
// cancellation and the answer is lost, recovery is an hour away — and the
// provider's callback (its sender → POST /webhooks/provider, signed with
// the shared secret → the engine) settles it: the operation SUCCEEDS, and
// its timeline says the provider called back.
func TestTheProvidersCallbackSettlesALostAnswerBeforeRecoveryAsks(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "500ms", "RECOVERY_INTERVAL": "1h"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	ctl := fake.NewControl(s.ProviderURL)
	if _, err := ctl.SetWebhookSettings(context.Background(), fault.WebhookSettings{Mode: fault.WebhooksDuplicate}); err != nil {
		t.Fatal(err)
	}
	pid := s.policyOf(t, "demo-alice", 0)
	r := s.do(cancelReq(pid, "demo-alice", "cb-1", `{"reason":"moving abroad"}`))
	if r.Status != 202 {
		t.Fatalf("POST cancel: %d %s, want 202", r.Status, r.Body)
	}
	var op struct {
		ID       int64
		Status   string
		Timeline []struct{ Detail string }
	}
	r.JSON(t, &op)
	waitUntil(t, 10*time.Second, func() bool {
		s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op.ID), Token: "demo-alice"}).JSON(t, &op)
		return op.Status == "SUCCEEDED"
	})
	called := false
	for _, ev := range op.Timeline {
		called = called || strings.Contains(ev.Detail, "the provider called back: COMPLETED")
	}
	if !called {
		t.Errorf("the timeline does not say the provider called back: %+v", op.Timeline)
	}
	var applied, duplicates int
	s.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE outcome = 'applied'), coalesce(sum(duplicates), 0)
		  FROM webhook_inbox
		 WHERE operation_id = $1`, op.ID).Scan(&applied, &duplicates)
	if applied != 1 {
		t.Errorf("%d callbacks applied, want 1", applied)
	}
	waitUntil(t, 5*time.Second, func() bool {
		s.DB.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(duplicates), 0) FROM webhook_inbox WHERE operation_id = $1`, op.ID).Scan(&duplicates)
		return duplicates >= 1
	})
}
