package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// The cancellation killed with SIGKILL at each of its crash points, then the
// server restarted: what was durable at the crash is exactly what
// docs/cancellation.md says (nothing half-written), the restarted server's
// recovery loop finishes the work, and the client's retry with the same key
// gets the outcome without a second provider effect.
func TestCrashAtEachPointThenRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		at string
		// durable at the crash
		opStatus, keyStatus, policyStatus string
		providerCalled                    bool
		events                            int
	}{
		// inside transaction 1, with the key's claim: it rolls back — nothing
		{"after_record_intent", "", "", "ACTIVE", false, 0},
		// transaction 1 committed (intent, provider_cancel SENT), no call
		{"before_provider_cancel", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", false, 2},
		{"after_claim", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", false, 2}, // its older name
		// the call made, its outcome not recorded
		{"after_provider_cancel", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", true, 2},
		{"after_provider_call", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", true, 2}, // its older name
		// inside transaction 2, after each local step: it rolls back whole
		{"after_mark_cancelled", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", true, 2},
		{"after_publish_event", "IN_PROGRESS", "IN_PROGRESS", "ACTIVE", true, 2},
		// transaction 2 committed (the policy cancelled, refund SENT), no refund call
		{"before_refund", "IN_PROGRESS", "IN_PROGRESS", "CANCELLED", true, 6},
		// the refund made, its outcome not recorded
		{"after_refund", "IN_PROGRESS", "IN_PROGRESS", "CANCELLED", true, 6},
		// inside transaction 3: it rolls back whole
		{"after_audit", "IN_PROGRESS", "IN_PROGRESS", "CANCELLED", true, 6},
		// the outcome and the answer committed; the answer not sent
		{"after_commit", "SUCCEEDED", "COMPLETED", "CANCELLED", true, 9},
	} {
		t.Run(tc.at, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			_, provURL := externalProvider(t, db) // it survives the app's crash
			env := map[string]string{
				"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "PROVIDER_URL": provURL, "PAYMENTS_ADDR": "127.0.0.1:0",
				"SESSION_SECRET": "s", "LOG_LEVEL": "warn", "DB_MAX_CONNS": "5",
				"PROVIDER_TIMEOUT": "10s", "OPERATION_LEASE": "1s", "IDEMPOTENCY_LEASE": "1s",
				"RECOVERY_INTERVAL": "100ms",
			}

			// 1. Die at the crash point.
			crashing := map[string]string{"CRASH_AT": tc.at}
			for k, v := range env {
				crashing[k] = v
			}
			// The victim's own recovery loop stays out of it: on a loaded
			// machine its request may outlive the 1 s lease before reaching
			// the crash point, and its loop would claim the operation first.
			crashing["RECOVERY_INTERVAL"] = "1h"
			victim := startChild(t, crashing)
			var policyID int64
			db.Pool.QueryRow(ctx, `SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id WHERE u.name = 'alice' ORDER BY p.id LIMIT 1`).Scan(&policyID)
			path := fmt.Sprintf("/api/v1/policies/%d/cancel", policyID)
			if _, err := noRedirectClient(nil).Do(mustRequest(t, victim.URL+path, "demo-alice", "crash-key")); err == nil {
				t.Fatal("the request was answered; the process should have died first")
			}
			state := victim.waitExit(t, 10*time.Second)
			killed := time.Now()
			if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the server ended with %v, not SIGKILL", state)
			}

			// 2. What is durable is exactly what the crash window table says.
			var opStatus, keyStatus, policyStatus, providerKey string
			var events, effects, providerRequests int
			db.Pool.QueryRow(ctx, `
				SELECT o.status, s.step_key
				  FROM operations o
				  JOIN operation_steps s ON s.operation_id = o.id AND s.run = o.run AND s.name = 'provider_cancel'
				 WHERE o.policy_id = $1`, policyID).Scan(&opStatus, &providerKey)
			db.Pool.QueryRow(ctx, `SELECT status FROM idempotency_keys WHERE idempotency_key = 'crash-key'`).Scan(&keyStatus)
			db.Pool.QueryRow(ctx, `SELECT status FROM policies WHERE id = $1`, policyID).Scan(&policyStatus)
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events`).Scan(&events)
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.effects WHERE policy_id = $1`, policyID).Scan(&effects)
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.requests WHERE idempotency_key = $1`, providerKey).Scan(&providerRequests)
			if opStatus != tc.opStatus || keyStatus != tc.keyStatus || policyStatus != tc.policyStatus || events != tc.events {
				t.Fatalf("at the crash: operation %s, key %s, policy %s, %d events; want %s, %s, %s, %d",
					opStatus, keyStatus, policyStatus, events, tc.opStatus, tc.keyStatus, tc.policyStatus, tc.events)
			}
			if (providerRequests == 1) != tc.providerCalled || effects != providerRequests {
				t.Fatalf("at the crash: provider saw %d requests, %d effects; called = %v expected", providerRequests, effects, tc.providerCalled)
			}

			// 3. Restart: the recovery loop finishes what the crash left.
			restarted := startChild(t, env)
			if tc.opStatus != "" {
				waitUntil(t, 30*time.Second, func() bool {
					db.Pool.QueryRow(ctx, `SELECT status FROM operations WHERE policy_id = $1`, policyID).Scan(&opStatus)
					return opStatus == "SUCCEEDED"
				})
				// The figure for docs/cancellation.md: kill → finished by the
				// restarted instance's recovery (its start and OPERATION_LEASE=1s included).
				t.Logf("crash at %s → SUCCEEDED %s after the kill", tc.at, time.Since(killed).Round(10*time.Millisecond))
			} // else nothing was left to recover: the client's retry runs the cancellation afresh

			// 4. The client retries with the same key (once the dead request's
			// key lease has run out): it gets the outcome, and the provider
			// applied the cancellation exactly once.
			var retry response
			waitUntil(t, 10*time.Second, func() bool {
				retry = doWith(t, noRedirectClient(nil), restarted.URL, request{Method: "POST", Path: path, Token: "demo-alice",
					Header: map[string]string{"Idempotency-Key": "crash-key"}})
				return retry.Status != 409
			})
			if retry.Status != 200 || !bytes.Contains(retry.Body, []byte(`"status":"SUCCEEDED"`)) {
				t.Fatalf("retry after restart: %d %s", retry.Status, retry.Body)
			}
			again := doWith(t, noRedirectClient(nil), restarted.URL, request{Method: "POST", Path: path, Token: "demo-alice",
				Header: map[string]string{"Idempotency-Key": "crash-key"}})
			if again.Status != 200 || !bytes.Equal(again.Body, retry.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second retry: %d %s", again.Status, again.Body)
			}
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.effects WHERE policy_id = $1`, policyID).Scan(&effects)
			if effects != 1 {
				t.Fatalf("provider effects %d after recovery and retries", effects)
			}
			var refunds int
			db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_payments.ledger WHERE kind = 'refund' AND policy_id = $1`, policyID).Scan(&refunds)
			if refunds != 1 {
				t.Fatalf("refunds %d after recovery and retries", refunds)
			}
			if r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: time.Minute}); err != nil || !r.OK {
				t.Fatalf("invariants: %+v (%v)", r.Violations, err)
			}
		})
	}
}

func mustRequest(t *testing.T, url, token, key string) *http.Request {
	t.Helper()
	req, err := newRequest("POST", url, token, key)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// A crash point armed to abandon, reached by the recovery loop rather than
// a request (fourth read: after_mark_cancelled with the provider on
// lost_response — recovery learns COMPLETED and marks the policy — ended the
// whole app with "abort Handler [recovered, repanicked]"). The attempt ends
// as a killed worker's would; the server stays up, and once the lease runs
// out recovery claims the operation again and finishes it.
func TestAnAbandonReachedByRecoveryEndsOnlyTheAttempt(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "500ms", "OPERATION_LEASE": "1s",
		"RECOVERY_INTERVAL": "100ms", "RECOVERY_POLL_INTERVAL": "100ms"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeLostResponse })
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin", Body: `{"at": "after_mark_cancelled", "mode": "abandon", "once": true}`}); r.Status != http.StatusOK {
		t.Fatalf("arming a crash point: %d %s", r.Status, r.Body)
	}
	pid := s.policyOf(t, "demo-alice", 0)
	if r := s.do(cancelReq(pid, "demo-alice", "abandon-in-recovery", "")); r.Status != http.StatusAccepted {
		t.Fatalf("cancel with the answer lost: %d %s, want 202", r.Status, r.Body)
	}
	s.setFaults(t, func(f *fake.Fault) {}) // the refund and the next claim are answered
	var status string
	waitUntil(t, 2*time.Minute, func() bool {
		if err := s.DB.Pool.QueryRow(context.Background(), `SELECT status FROM operations WHERE policy_id = $1`, pid).Scan(&status); err != nil {
			t.Fatal(err)
		}
		return status == "SUCCEEDED"
	})
	var fired bool
	r := s.do(request{Method: "GET", Path: "/api/v1/admin/crash", Token: "demo-admin"})
	fired = r.Status == http.StatusOK && !strings.Contains(string(r.Body), "after_mark_cancelled")
	if !fired {
		t.Errorf("the crash point never fired (still armed): %s", r.Body)
	}
	if n := s.effects(t, pid); n != 1 {
		t.Errorf("%d provider effects, want 1", n)
	}
}
