package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/provider/fake"
)

// setFaults sets the global fault of the server's fake provider.
func (s *testServer) setFaults(t testing.TB, mutate func(*fake.Fault)) {
	t.Helper()
	f := fake.DefaultFault()
	mutate(&f)
	ctl := fake.NewControl(s.ProviderURL)
	defer ctl.CloseIdleConnections()
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// effects counts the provider's cancellation effects for a policy (due and pending).
func (s *testServer) effects(t testing.TB, policyID int64) int64 {
	t.Helper()
	ctl := fake.NewControl(s.ProviderURL)
	defer ctl.CloseIdleConnections()
	eff, err := ctl.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, pe := range eff.ByPolicy {
		if pe.PolicyID == policyID {
			return pe.Count + pe.Pending
		}
	}
	return 0
}

// firstPolicy returns one of the customer's ACTIVE policies.
func (s *testServer) policyOf(t testing.TB, token string, i int) int64 {
	t.Helper()
	var list pageJSON[policyJSON]
	s.do(request{Method: "GET", Path: "/api/v1/policies", Token: token}).JSON(t, &list)
	return list.Items[i].ID
}

// assertInvariants checks the invariants (docs/invariants.md) over the server's database.
func (s *testServer) assertInvariants(t testing.TB) {
	t.Helper()
	r, err := invariants.Check(context.Background(), s.DB.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("invariants broken: %+v", r.Violations)
	}
}

type operationJSON struct {
	ID       int64  `json:"id"`
	PolicyID int64  `json:"policy_id"`
	Status   string `json:"status"`
	Steps    []struct {
		Name  string `json:"name"`
		Key   string `json:"key"`
		State string `json:"state"`
	} `json:"steps"`
	Timeline []struct {
		ToStatus  string `json:"to_status"`
		Statement string `json:"statement"`
	} `json:"timeline"`
	Provider struct {
		Truth string `json:"truth"`
		Error string `json:"error"`
	} `json:"provider"`
}

func cancelReq(policyID int64, token, key, body string) request {
	return request{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", policyID), Token: token, Body: body,
		Header: map[string]string{"Idempotency-Key": key}}
}

func TestCancelAnswersForEachProviderMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode         fake.Mode
		status       int
		opStatus     string
		policyStatus string
		effects      int64
		truth        string
	}{
		{fake.ModeOK, 200, "SUCCEEDED", "CANCELLED", 1, "COMPLETED"},
		{fake.ModeReject, 422, "FAILED", "ACTIVE", 0, "REJECTED"},
		{fake.ModeError, 202, "IN_PROGRESS", "ACTIVE", 0, "NOT_STARTED"},
		{fake.ModeDrop, 202, "IN_PROGRESS", "ACTIVE", 0, "NOT_STARTED"},
		{fake.ModeLostResponse, 202, "IN_PROGRESS", "ACTIVE", 1, "COMPLETED"},
		{fake.ModeSlow, 202, "IN_PROGRESS", "ACTIVE", 1, "RUNNING"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			// Modes that never answer cost one short timeout; answered modes get a
			// patient client, so a loaded machine cannot turn an answer into a timeout.
			timeout := "10s"
			if tc.status == 202 && tc.mode != fake.ModeError {
				timeout = "500ms"
			}
			// Recovery stays out of the way (one pass at start, then an hour),
			// so what is read below is the request's own outcome.
			s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": timeout, "RECOVERY_INTERVAL": "1h"})
			s.setFaults(t, func(f *fake.Fault) { f.Mode = tc.mode; f.SlowMS = 60000 })
			pid := s.policyOf(t, "demo-alice", 0)
			r := s.do(cancelReq(pid, "demo-alice", "key-"+string(tc.mode), `{"reason":"moving abroad"}`))
			if r.Status != tc.status {
				t.Fatalf("POST cancel: %d %s, want %d", r.Status, r.Body, tc.status)
			}
			var opID int64
			switch tc.status {
			case 422:
				var p struct {
					Type        string `json:"type"`
					OperationID int64  `json:"operation_id"`
				}
				r.JSON(t, &p)
				if p.Type != "provider-rejected" || p.OperationID == 0 {
					t.Fatalf("422 body %s", r.Body)
				}
				opID = p.OperationID
			default:
				var op operationJSON
				r.JSON(t, &op)
				opID = op.ID
				if tc.status == 202 && r.Header.Get("Location") != fmt.Sprintf("/api/v1/operations/%d", op.ID) {
					t.Errorf("202 Location %q", r.Header.Get("Location"))
				}
			}
			// The provider finishes what it received on its own time (lost_response
			// commits its effect while it holds the caller): wait for its ledger.
			waitUntil(t, 5*time.Second, func() bool { return s.effects(t, pid) == tc.effects })
			var op operationJSON
			got := s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", opID), Token: "demo-alice"})
			got.JSON(t, &op)
			if op.Status != tc.opStatus || op.Provider.Truth != tc.truth {
				t.Errorf("operation %s, provider truth %q; want %s, %s", op.Status, op.Provider.Truth, tc.opStatus, tc.truth)
			}
			if len(op.Timeline) < 2 || op.Timeline[0].Statement == "" {
				t.Errorf("timeline %+v", op.Timeline)
			}
			var pol policyJSON
			s.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/policies/%d", pid), Token: "demo-alice"}).JSON(t, &pol)
			if pol.Status != tc.policyStatus {
				t.Errorf("policy %s, want %s", pol.Status, tc.policyStatus)
			}
			if n := s.effects(t, pid); n != tc.effects {
				t.Errorf("effects %d, want %d", n, tc.effects)
			}
			// The same key again replays the first answer, byte for byte.
			again := s.do(cancelReq(pid, "demo-alice", "key-"+string(tc.mode), `{"reason":"moving abroad"}`))
			if again.Status != r.Status || !bytes.Equal(again.Body, r.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("replay: %d %s (replayed=%q), first %d %s", again.Status, again.Body, again.Header.Get("Idempotent-Replayed"), r.Status, r.Body)
			}
			// With faults off, invariants 1, 2, 4 and 5 hold (6 is the recovery loop's).
			s.setFaults(t, func(f *fake.Fault) {})
			s.assertInvariants(t)
		})
	}
}

// Fifty cancellations of one policy with fifty different keys — request
// identity differs, business identity is the same — make one operation and
// at most one provider effect; the rest are told which operation exists.
func TestConcurrentCancellationsWithDifferentKeys(t *testing.T) {
	t.Parallel()
	// 50 writes at once from one user: past its rate limit, on purpose. The
	// winner's provider call gets 30s: with the default 2s, a loaded machine
	// makes it outlive its timeout, and the correct answer is then a 202.
	// 12 connections still race fifty requests at the database; the fakes
	// need few (the suite keeps under 60 connections at once).
	s := startServer(t, map[string]string{"DB_MAX_CONNS": "12", "FAKE_DB_MAX_CONNS": "4", "RATE_LIMIT_WRITES_PER_USER": "off", "PROVIDER_TIMEOUT": "30s"})
	pid := s.policyOf(t, "demo-bob", 0)
	const n = 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	byStatus := map[int]int{}
	var dupBodies [][]byte
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := s.do(cancelReq(pid, "demo-bob", fmt.Sprintf("click-%02d", i), ""))
			mu.Lock()
			defer mu.Unlock()
			byStatus[r.Status]++
			if r.Status == http.StatusConflict {
				dupBodies = append(dupBodies, r.Body)
			}
		}()
	}
	close(start)
	wg.Wait()
	if byStatus[200] != 1 || byStatus[409] != n-1 {
		t.Fatalf("answers by status %v, want one 200 and %d 409", byStatus, n-1)
	}
	for _, b := range dupBodies {
		if !bytes.Contains(b, []byte(`"type":"duplicate-intent"`)) || !bytes.Contains(b, []byte(`"operation_id":`)) {
			t.Fatalf("409 body %s", b)
		}
	}
	var ops int
	s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM operations WHERE policy_id = $1`, pid).Scan(&ops)
	if ops != 1 || s.effects(t, pid) != 1 {
		t.Fatalf("operations %d, effects %d", ops, s.effects(t, pid))
	}
	s.assertInvariants(t)
}

// The same key sent again while the first request still runs is told to
// come back (409 + Retry-After); sent after it finished, it gets the answer.
func TestSameKeyDuringAndAfterExecution(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "5s"})
	// slow, but within the caller's patience: the first request takes ~1.5s and succeeds
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeSlow; f.SlowMS = 1500 })
	pid := s.policyOf(t, "demo-carol", 1)

	first := make(chan response, 1)
	go func() { first <- s.do(cancelReq(pid, "demo-carol", "same-key", "")) }()
	// Wait until the first request owns the key.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		s.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'same-key'`).Scan(&n)
		if n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	during := s.do(cancelReq(pid, "demo-carol", "same-key", ""))
	if during.Status != http.StatusConflict || during.problemType() != "request-in-progress" || during.Header.Get("Retry-After") == "" {
		t.Fatalf("during: %d %s (Retry-After %q)", during.Status, during.Body, during.Header.Get("Retry-After"))
	}
	r := <-first
	if r.Status != 200 {
		t.Fatalf("first: %d %s", r.Status, r.Body)
	}
	after := s.do(cancelReq(pid, "demo-carol", "same-key", ""))
	if after.Status != 200 || !bytes.Equal(after.Body, r.Body) || after.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after: %d %s", after.Status, after.Body)
	}
	// Same key, different request: 422.
	other := s.do(cancelReq(pid, "demo-carol", "same-key", `{"reason":"changed my mind"}`))
	if other.Status != http.StatusUnprocessableEntity || other.problemType() != "idempotency-key-reused" {
		t.Fatalf("same key, other body: %d %s", other.Status, other.Body)
	}
	s.assertInvariants(t)
}

// Bad input is refused before anything runs, and leaves nothing behind.
func TestCancelRefusesBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	pid := s.policyOf(t, "demo-alice", 2)
	bobs := s.policyOf(t, "demo-bob", 2)
	long := bytes.Repeat([]byte("x"), 600)
	for _, tc := range []struct {
		name   string
		req    request
		status int
		typ    string
	}{
		{"no key", request{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", pid), Token: "demo-alice"}, 400, "idempotency-key-missing"},
		{"malformed key", cancelReq(pid, "demo-alice", "bad key with spaces", ""), 400, "idempotency-key-malformed"},
		{"invalid JSON", cancelReq(pid, "demo-alice", "k-json", `{"reason":`), 400, "invalid-json"},
		{"unknown field", cancelReq(pid, "demo-alice", "k-field", `{"reasn":"x"}`), 400, "invalid-json"},
		{"reason too long", cancelReq(pid, "demo-alice", "k-long", `{"reason":"`+string(long)+`"}`), 422, "validation-failed"},
		{"not JSON", request{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", pid), Token: "demo-alice", Body: "reason=x",
			Header: map[string]string{"Idempotency-Key": "k-form", "Content-Type": "application/x-www-form-urlencoded"}}, 415, "unsupported-media-type"},
		{"someone else's policy", cancelReq(bobs, "demo-alice", "k-bob", ""), 404, "not-found"},
		{"unknown policy", cancelReq(999999, "demo-alice", "k-unknown", ""), 404, "not-found"},
		{"no token", request{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", pid), Header: map[string]string{"Idempotency-Key": "k"}}, 401, "unauthenticated"},
	} {
		r := s.do(tc.req)
		if r.Status != tc.status || r.problemType() != tc.typ {
			t.Errorf("%s: %d %s, want %d %s", tc.name, r.Status, r.Body, tc.status, tc.typ)
		}
	}
	var ops, keys int
	s.DB.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM operations), (SELECT count(*) FROM idempotency_keys WHERE status = 'IN_PROGRESS')`).Scan(&ops, &keys)
	if ops != 0 || keys != 0 {
		t.Fatalf("bad requests left %d operations and %d keys in progress", ops, keys)
	}
	// A refused request's key was released: corrected, the same key works.
	if r := s.do(cancelReq(pid, "demo-alice", "k-json", `{"reason":"fixed"}`)); r.Status != 200 {
		t.Fatalf("corrected request with the released key: %d %s", r.Status, r.Body)
	}
	s.assertInvariants(t)
}

// An admin arms "abandon" at after_provider_call: the request is cut off
// mid-flight and nothing more is written — the operation and the key stay
// IN_PROGRESS, as after a crash — while the server stays up.
func TestAbandonAtACrashPointLeavesWorkInProgress(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-alice", Body: `{"at":"after_claim"}`}); r.Status != 403 {
		t.Fatalf("customer arming a crash: %d", r.Status)
	}
	if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin", Body: `{"at":"somewhere"}`}); r.Status != 400 || r.problemType() != "invalid-crash-point" {
		t.Fatalf("bad crash point: %d %s", r.Status, r.Body)
	}
	r := s.do(request{Method: "PUT", Path: "/api/v1/admin/crash", Token: "demo-admin", Body: `{"at":"after_provider_call","mode":"abandon","once":true}`})
	if r.Status != 200 {
		t.Fatalf("arm: %d %s", r.Status, r.Body)
	}
	pid := s.policyOf(t, "demo-carol", 0)
	// Go's Transport itself retries a request carrying Idempotency-Key when
	// the connection breaks — if it can replay the body. A body it cannot
	// rewind keeps this to one attempt, so the test sees the cut itself.
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v1/policies/%d/cancel", s.URL, pid), io.NopCloser(strings.NewReader("")))
	req.Header.Set("Authorization", "Bearer demo-carol")
	req.Header.Set("Idempotency-Key", "abandoned")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("abandoned request answered %d", resp.StatusCode)
	}
	var opStatus, keyStatus string
	s.DB.Pool.QueryRow(context.Background(), `SELECT status FROM operations WHERE policy_id = $1`, pid).Scan(&opStatus)
	s.DB.Pool.QueryRow(context.Background(), `SELECT status FROM idempotency_keys WHERE idempotency_key = 'abandoned'`).Scan(&keyStatus)
	if opStatus != "IN_PROGRESS" || keyStatus != "IN_PROGRESS" {
		t.Fatalf("after abandon: operation %q, key %q", opStatus, keyStatus)
	}
	if n := s.effects(t, pid); n != 1 {
		t.Fatalf("the provider was called before the crash point: effects %d", n)
	}
	// once: disarmed after firing; the server is still up.
	var cs crash.Setting
	s.do(request{Method: "GET", Path: "/api/v1/admin/crash", Token: "demo-admin"}).JSON(t, &cs)
	if cs.At != "" {
		t.Fatalf("still armed: %+v", cs)
	}
	// The same key is in flight until its lease runs out.
	if r := s.do(cancelReq(pid, "demo-carol", "abandoned", "")); r.Status != 409 || r.problemType() != "request-in-progress" {
		t.Fatalf("retry during the key's lease: %d %s", r.Status, r.Body)
	}
}
