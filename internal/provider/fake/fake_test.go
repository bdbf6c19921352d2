package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// callerTimeout is the impatient client's per-call timeout: short, so the
// timeout modes cost little. Calls expected to be answered use a patient
// client instead, so a loaded machine (-race, parallel tests) cannot turn an
// answer into a timeout.
const callerTimeout = 400 * time.Millisecond

// bundle is one fake provider served over real HTTP, with the real client.
type bundle struct {
	db        *testdb.DB
	fake      *fake.Provider
	srv       *httptest.Server
	client    *provider.HTTPClient // patient: 5s
	impatient *provider.HTTPClient // gives up after callerTimeout
	control   *fake.Control

	inflight  atomic.Int64 // handlers running right now
	openConns atomic.Int64 // server-side connections not yet closed
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return serve(t, testdb.New(t))
}

// serve starts a provider on db. A second serve on the same db is the
// provider restarted: a new process, the same durable state.
func serve(t *testing.T, db *testdb.DB) *bundle {
	t.Helper()
	b := &bundle{db: db}
	b.fake = fake.New(db.Pool, fake.Options{
		HoldCap: 10 * time.Second,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	h := b.fake.Handler()
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.inflight.Add(1)
		defer b.inflight.Add(-1) // runs on abort too: the handler has returned
		h.ServeHTTP(w, r)
	}))
	b.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			b.openConns.Add(1)
		case http.StateClosed, http.StateHijacked:
			b.openConns.Add(-1)
		}
	}
	b.srv.Start()
	b.client = provider.NewHTTPClient(b.srv.URL, 5*time.Second)
	b.impatient = provider.NewHTTPClient(b.srv.URL, callerTimeout)
	b.control = fake.NewControl(b.srv.URL)
	t.Cleanup(b.stop)
	return b
}

// stop shuts the provider down; safe to call twice.
func (b *bundle) stop() {
	b.client.CloseIdleConnections()
	b.impatient.CloseIdleConnections()
	b.control.CloseIdleConnections()
	b.fake.Close()
	b.srv.Close()
}

func (b *bundle) setFault(t *testing.T, f fake.Fault) {
	t.Helper()
	if _, err := b.control.SetFaults(context.Background(), f); err != nil {
		t.Fatalf("set fault %+v: %v", f, err)
	}
}

func (b *bundle) cancel(t *testing.T, key string, policyID int64) provider.Result {
	t.Helper()
	res, err := b.client.Cancel(context.Background(), provider.CancelRequest{Key: key, PolicyID: policyID, Reason: "test"})
	if err != nil {
		t.Fatalf("cancel %s: request not sent: %v", key, err)
	}
	return res
}

// cancelAndGiveUp calls with the impatient client and fails unless the
// caller gave up: no answer arrived within callerTimeout.
func (b *bundle) cancelAndGiveUp(t *testing.T, key string, policyID int64) provider.Result {
	t.Helper()
	start := time.Now()
	res, err := b.impatient.Cancel(context.Background(), provider.CancelRequest{Key: key, PolicyID: policyID, Reason: "test"})
	if err != nil {
		t.Fatalf("cancel %s: request not sent: %v", key, err)
	}
	if !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Fatalf("cancel %s = %s (%v), want the caller's own timeout", key, res.Outcome, res.Err)
	}
	if waited := time.Since(start); waited < callerTimeout {
		t.Fatalf("cancel %s: the caller waited %v, less than its timeout", key, waited)
	}
	// The caller has given up; the provider finishes what it received on
	// its own time. Wait for its handlers to return, so what the test reads
	// next is the provider's settled truth, not a race with its commit.
	deadline := time.Now().Add(5 * time.Second)
	for b.inflight.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return res
}

func (b *bundle) wantTruth(t *testing.T, key string, want provider.Truth) {
	t.Helper()
	got, err := b.client.Status(context.Background(), key)
	if err != nil {
		t.Fatalf("status %s: %v", key, err)
	}
	if got != want {
		t.Fatalf("truth of %s = %s, want %s", key, got, want)
	}
}

func (b *bundle) effects(t *testing.T) fake.Effects {
	t.Helper()
	e, err := b.control.Effects(context.Background())
	if err != nil {
		t.Fatalf("effects: %v", err)
	}
	return e
}

// assertSettled fails unless every handler has returned and every connection
// has closed within a second: a call the caller gave up on must leave no
// goroutine and no connection behind. Idle keep-alive connections are closed
// first; they are a pool, not a leak.
func (b *bundle) assertSettled(t *testing.T) {
	t.Helper()
	b.client.CloseIdleConnections()
	b.impatient.CloseIdleConnections()
	b.control.CloseIdleConnections()
	deadline := time.Now().Add(time.Second)
	for b.inflight.Load() != 0 || b.openConns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("leak: %d handlers still running, %d connections still open", b.inflight.Load(), b.openConns.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantOutcome(t *testing.T, res provider.Result, want provider.Outcome, truth provider.Truth) {
	t.Helper()
	if res.Outcome != want || res.Truth != truth {
		t.Fatalf("result = %s (truth %q, err %v), want %s (truth %q)", res.Outcome, res.Truth, res.Err, want, truth)
	}
}

func TestCancelInEveryMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode     fake.Mode
		outcome  provider.Outcome
		answered provider.Truth // Result.Truth: what the provider said, if anything
		truth    provider.Truth // the provider's truth afterwards
		applied  int64          // effects that have taken hold
		pending  int64          // effects scheduled to take hold
		timeout  bool           // the caller gives up waiting
	}{
		{fake.ModeOK, provider.Confirmed, provider.TruthCompleted, provider.TruthCompleted, 1, 0, false},
		{fake.ModeReject, provider.Rejected, provider.TruthRejected, provider.TruthRejected, 0, 0, false},
		{fake.ModeError, provider.Unknown, "", provider.TruthNotStarted, 0, 0, false},
		{fake.ModeDrop, provider.Unknown, "", provider.TruthNotStarted, 0, 0, true},
		{fake.ModeLostResponse, provider.Unknown, "", provider.TruthCompleted, 1, 0, true},
		{fake.ModeSlow, provider.Unknown, "", provider.TruthRunning, 0, 1, true},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.setFault(t, fake.Fault{Mode: tt.mode, Idempotent: true, SlowMS: 60_000})

			var res provider.Result
			if tt.timeout {
				res = b.cancelAndGiveUp(t, "key-1", 7)
			} else {
				res = b.cancel(t, "key-1", 7)
			}
			wantOutcome(t, res, tt.outcome, tt.answered)
			if tt.mode == fake.ModeError {
				var se *provider.StatusError
				if !errors.As(res.Err, &se) || se.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("cause = %v, want HTTP 503", res.Err)
				}
			}
			if tt.outcome == provider.Rejected && res.Reason == "" {
				t.Fatal("a rejection carries no reason")
			}

			b.wantTruth(t, "key-1", tt.truth)
			e := b.effects(t)
			if e.Total != tt.applied || e.Pending != tt.pending {
				t.Fatalf("effects = %d applied, %d pending; want %d, %d", e.Total, e.Pending, tt.applied, tt.pending)
			}
			b.assertSettled(t)
		})
	}
}

func TestSlowCompletesByTimeAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeSlow, Idempotent: true, SlowMS: 60_000})
	res := b.cancelAndGiveUp(t, "slow-1", 3)
	wantOutcome(t, res, provider.Unknown, "")

	// Move time instead of sleeping: an hour from now the request is done
	// and its one effect has taken hold, with no process having run.
	ctx, later := context.Background(), time.Now().Add(time.Hour)
	if got, err := b.fake.TruthAt(ctx, "slow-1", later); err != nil || got != provider.TruthCompleted {
		t.Fatalf("truth an hour later = %s, %v; want COMPLETED", got, err)
	}
	e, err := b.fake.EffectsAt(ctx, later)
	if err != nil {
		t.Fatal(err)
	}
	if e.Total != 1 || e.Pending != 0 || len(e.ByPolicy) != 1 || e.ByPolicy[0] != (fake.PolicyEffect{PolicyID: 3, Count: 1}) {
		t.Fatalf("effects an hour later = %+v, want one effect for policy 3", e)
	}
	b.wantTruth(t, "slow-1", provider.TruthRunning) // and now, it still runs
}

func TestSlowOnTheRealClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeSlow, Idempotent: true, SlowMS: 1000})
	res := b.cancelAndGiveUp(t, "slow-2", 3)
	wantOutcome(t, res, provider.Unknown, "")
	b.wantTruth(t, "slow-2", provider.TruthRunning)

	deadline := time.Now().Add(3 * time.Second)
	for {
		got, err := b.client.Status(context.Background(), "slow-2")
		if err != nil {
			t.Fatal(err)
		}
		if got == provider.TruthCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s after 3s", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e := b.effects(t); e.Total != 1 || e.Pending != 0 {
		t.Fatalf("effects = %+v, want one that has taken hold", e)
	}
	b.assertSettled(t)
}

func TestSlowWithinTheCallersPatienceIsConfirmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeSlow, Idempotent: true, SlowMS: 30})
	res := b.cancel(t, "slow-3", 3)
	wantOutcome(t, res, provider.Confirmed, provider.TruthCompleted)
}

func TestLatency(t *testing.T) {
	t.Parallel()
	t.Run("below the timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, LatencyMS: 30})
		wantOutcome(t, b.cancel(t, "k", 1), provider.Confirmed, provider.TruthCompleted)
	})
	t.Run("beyond the timeout the answer is lost", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// a script entry, so the status query below (governed by the global
		// fault's latency) answers at once
		b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, LatencyMS: 2000, Next: 1})
		res := b.cancelAndGiveUp(t, "k", 1)
		wantOutcome(t, res, provider.Unknown, "")
		b.wantTruth(t, "k", provider.TruthCompleted)
		b.assertSettled(t)
	})
}

func TestRepeats(t *testing.T) {
	t.Parallel()

	t.Run("idempotent: the retry after a lost response applies nothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeLostResponse, Idempotent: true, Next: 1})
		wantOutcome(t, b.cancelAndGiveUp(t, "k", 5), provider.Unknown, "")
		wantOutcome(t, b.cancel(t, "k", 5), provider.Confirmed, provider.TruthCompleted)
		if e := b.effects(t); e.Total != 1 {
			t.Fatalf("effects = %d, want 1", e.Total)
		}
		var attempts int
		if err := b.db.Pool.QueryRow(context.Background(),
			`SELECT attempts FROM fake_provider.requests WHERE idempotency_key = 'k'`).Scan(&attempts); err != nil || attempts != 2 {
			t.Fatalf("attempts = %d, %v; want 2", attempts, err)
		}
	})

	t.Run("not idempotent: the retry applies a second effect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: false})
		b.setFault(t, fake.Fault{Mode: fake.ModeLostResponse, Idempotent: false, Next: 1})
		wantOutcome(t, b.cancelAndGiveUp(t, "k", 5), provider.Unknown, "")
		wantOutcome(t, b.cancel(t, "k", 5), provider.Confirmed, provider.TruthCompleted)
		e := b.effects(t)
		if e.Total != 2 || len(e.ByPolicy) != 1 || e.ByPolicy[0].Count != 2 {
			t.Fatalf("effects = %+v, want policy 5 cancelled twice", e)
		}
	})

	t.Run("idempotent: a repeat gets the first outcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true, Next: 1})
		wantOutcome(t, b.cancel(t, "k", 5), provider.Rejected, provider.TruthRejected)
		wantOutcome(t, b.cancel(t, "k", 5), provider.Rejected, provider.TruthRejected) // now mode ok: still the first outcome
		if e := b.effects(t); e.Total != 0 {
			t.Fatalf("effects = %d, want 0", e.Total)
		}
	})

	t.Run("idempotent: a repeat of a running key answers RUNNING", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeSlow, Idempotent: true, SlowMS: 60_000, Next: 1})
		wantOutcome(t, b.cancelAndGiveUp(t, "k", 5), provider.Unknown, "")
		wantOutcome(t, b.cancel(t, "k", 5), provider.Unknown, provider.TruthRunning)
		if e := b.effects(t); e.Total != 0 || e.Pending != 1 {
			t.Fatalf("effects = %+v, want one pending", e)
		}
	})

	t.Run("a key reused for another policy is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wantOutcome(t, b.cancel(t, "k", 5), provider.Confirmed, provider.TruthCompleted)
		res := b.cancel(t, "k", 6)
		var se *provider.StatusError
		if res.Outcome != provider.Unknown || !errors.As(res.Err, &se) || se.StatusCode != http.StatusConflict {
			t.Fatalf("result = %+v, want Unknown with HTTP 409", res)
		}
		if e := b.effects(t); e.Total != 1 {
			t.Fatalf("effects = %d, want 1", e.Total)
		}
	})
}

func TestConcurrentCallsWithOneKey(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		name := map[bool]string{true: "idempotent: one effect", false: "not idempotent: one effect per call"}[idempotent]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: idempotent})
			const n = 12
			start := make(chan struct{})
			results := make([]provider.Result, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], _ = b.client.Cancel(context.Background(), provider.CancelRequest{Key: "same", PolicyID: 9})
				})
			}
			close(start)
			wg.Wait()
			for _, res := range results {
				wantOutcome(t, res, provider.Confirmed, provider.TruthCompleted)
			}
			want := int64(1)
			if !idempotent {
				want = n
			}
			if e := b.effects(t); e.Total != want {
				t.Fatalf("effects = %d, want %d", e.Total, want)
			}
		})
	}
}

func TestTruthSurvivesARestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeLostResponse, Idempotent: true})
	b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true, PolicyID: new(int64(8))})
	wantOutcome(t, b.cancelAndGiveUp(t, "lost", 7), provider.Unknown, "")
	b.stop() // the provider process dies

	again := serve(t, b.db)
	again.wantTruth(t, "lost", provider.TruthCompleted)
	again.wantTruth(t, "never", provider.TruthNotStarted)
	if e := again.effects(t); e.Total != 1 {
		t.Fatalf("effects after restart = %d, want 1", e.Total)
	}
	cfg, err := again.control.Faults(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Global.Mode != fake.ModeLostResponse || len(cfg.Overrides) != 1 || cfg.Overrides[0].Mode != fake.ModeReject {
		t.Fatalf("faults after restart = %+v, want them kept", cfg)
	}
}

func TestScript(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.setFault(t, fake.Fault{Mode: fake.ModeError, Idempotent: true})
	b.setFault(t, fake.Fault{Mode: fake.ModeLostResponse, Idempotent: true, Next: 1})
	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, Next: 2})
	b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true, Next: 1, PolicyID: new(int64(50))})

	cfg, err := b.control.Faults(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Script) != 3 || cfg.Script[0].Mode != fake.ModeLostResponse || cfg.Script[1].Next != 2 {
		t.Fatalf("script = %+v, want lost_response×1, ok×2, reject×1 for policy 50", cfg.Script)
	}

	// policy 50's entry is queued last, but only its calls can use it, and
	// the older entries match it too: it goes after them.
	steps := []struct {
		key     string
		policy  int64
		outcome provider.Outcome
	}{
		{"a", 1, provider.Unknown},   // lost_response (the caller gives up)
		{"b", 1, provider.Confirmed}, // ok (1 of 2)
		{"c", 1, provider.Confirmed}, // ok (2 of 2)
		{"d", 1, provider.Unknown},   // policy 50's entry does not match: global error
		{"e", 50, provider.Rejected}, // reject for policy 50
		{"f", 50, provider.Unknown},  // script empty: global error
	}
	b.cancelAndGiveUp(t, steps[0].key, steps[0].policy)
	for _, s := range steps[1:] {
		if res := b.cancel(t, s.key, s.policy); res.Outcome != s.outcome {
			t.Fatalf("call %s = %s (%v), want %s", s.key, res.Outcome, res.Err, s.outcome)
		}
	}
	if cfg, err = b.control.Faults(ctx); err != nil || len(cfg.Script) != 0 {
		t.Fatalf("script after use = %+v, %v; want empty", cfg.Script, err)
	}
	b.wantTruth(t, "a", provider.TruthCompleted)
	b.wantTruth(t, "d", provider.TruthNotStarted)
}

func TestScriptEntriesAreUsedExactlyOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeError, Idempotent: true})
	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, Next: 3})
	b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true, Next: 2})

	const n = 10
	start := make(chan struct{})
	results := make([]provider.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], _ = b.client.Cancel(context.Background(), provider.CancelRequest{Key: fmt.Sprint("k", i), PolicyID: 1})
		})
	}
	close(start)
	wg.Wait()
	count := map[provider.Outcome]int{}
	for _, res := range results {
		count[res.Outcome]++
	}
	if count[provider.Confirmed] != 3 || count[provider.Rejected] != 2 || count[provider.Unknown] != 5 {
		t.Fatalf("outcomes = %v, want 3 confirmed, 2 rejected, 5 unknown (the global error)", count)
	}
}

func TestScopes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true})
	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, PolicyID: new(int64(7))})

	wantOutcome(t, b.cancel(t, "p7", 7), provider.Confirmed, provider.TruthCompleted) // the override beats the global fault
	wantOutcome(t, b.cancel(t, "p8", 8), provider.Rejected, provider.TruthRejected)   // no override: global

	b.setFault(t, fake.Fault{Mode: fake.ModeError, Idempotent: true, PolicyID: new(int64(7)), Next: 1})
	wantOutcome(t, b.cancel(t, "p7b", 7), provider.Unknown, "") // the script beats the override
	wantOutcome(t, b.cancel(t, "p7c", 7), provider.Confirmed, provider.TruthCompleted)
}

func TestStatusFaults(t *testing.T) {
	t.Parallel()
	t.Run("error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		wantOutcome(t, b.cancel(t, "k", 1), provider.Confirmed, provider.TruthCompleted)
		b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, StatusMode: fake.StatusError})
		_, err := b.client.Status(context.Background(), "k")
		var se *provider.StatusError
		if !errors.Is(err, provider.ErrUnreachable) || !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("status = %v, want ErrUnreachable from HTTP 503", err)
		}
	})
	t.Run("drop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, StatusMode: fake.StatusDrop})
		_, err := b.impatient.Status(context.Background(), "k")
		if !errors.Is(err, provider.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("status = %v, want ErrUnreachable from a timeout", err)
		}
		b.assertSettled(t)
	})
	t.Run("only on the global fault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := b.control.SetFaults(context.Background(),
			fake.Fault{Mode: fake.ModeOK, StatusMode: fake.StatusError, PolicyID: new(int64(1)), Weights: fake.DefaultWeights()})
		if !errors.Is(err, fake.ErrInvalidFault) {
			t.Fatalf("err = %v, want ErrInvalidFault", err)
		}
	})
}

func TestFlakyReplaysItsSeed(t *testing.T) {
	t.Parallel()
	run := func(seed int64) []provider.Outcome {
		b := setup(t)
		b.setFault(t, fake.Fault{Mode: fake.ModeFlaky, Idempotent: true, Seed: seed,
			Weights: fake.Weights{fake.ModeOK: 1, fake.ModeReject: 1, fake.ModeError: 1}})
		var got []provider.Outcome
		for _, key := range strings.Split("a b c d e f g h i j k l", " ") {
			got = append(got, b.cancel(t, key, 1).Outcome)
		}
		return got
	}
	first, again, other := run(42), run(42), run(7)
	if !equal(first, again) {
		t.Fatalf("seed 42 gave %v, then %v", first, again)
	}
	if equal(first, other) {
		t.Fatalf("seeds 42 and 7 both gave %v", first)
	}
	kinds := map[provider.Outcome]bool{}
	for _, o := range first {
		kinds[o] = true
	}
	if len(kinds) < 2 {
		t.Fatalf("seed 42 gave only %v: not a mix", first)
	}
}

func TestCloseReleasesHeldRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeDrop, Idempotent: true})
	patient := provider.NewHTTPClient(b.srv.URL, time.Minute)
	defer patient.CloseIdleConnections()

	done := make(chan provider.Result)
	go func() {
		res, _ := patient.Cancel(context.Background(), provider.CancelRequest{Key: "k", PolicyID: 1})
		done <- res
	}()
	for b.inflight.Load() == 0 {
		time.Sleep(2 * time.Millisecond)
	}
	b.fake.Close()
	select {
	case res := <-done:
		if res.Outcome != provider.Unknown || res.Err == nil {
			t.Fatalf("result = %+v, want Unknown with a broken connection", res)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not release the held request")
	}
	b.assertSettled(t)
}

func TestControl(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// The documented JSON, as a person would send it with curl.
	req, _ := http.NewRequest(http.MethodPut, b.srv.URL+"/v1/faults",
		strings.NewReader(`{"mode":"lost_response","idempotent":true,"slow_ms":5000,"policy_id":null,"next":0}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /v1/faults = %d", resp.StatusCode)
	}
	cfg, err := b.control.Faults(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Global; g.Mode != fake.ModeLostResponse || !g.Idempotent || g.SlowMS != 5000 || g.PolicyID != nil {
		t.Fatalf("global = %+v", g)
	}

	// Left-out fields take their defaults: {"mode":"drop"} stays idempotent.
	var f fake.Fault
	if err := json.Unmarshal([]byte(`{"mode":"drop"}`), &f); err != nil || !f.Idempotent || f.StatusMode != fake.StatusOK {
		t.Fatalf("decoded %+v, %v; want an idempotent drop", f, err)
	}

	if _, err := b.control.SetFaults(ctx, fake.Fault{Mode: "sometimes", Weights: fake.DefaultWeights()}); !errors.Is(err, fake.ErrInvalidFault) {
		t.Fatalf("bad mode: err = %v, want ErrInvalidFault", err)
	}

	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true})
	wantOutcome(t, b.cancel(t, "k", 1), provider.Confirmed, provider.TruthCompleted)
	b.setFault(t, fake.Fault{Mode: fake.ModeReject, Idempotent: true, PolicyID: new(int64(3))})
	b.setFault(t, fake.Fault{Mode: fake.ModeError, Idempotent: true, Next: 4})
	if err := b.control.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err = b.control.Faults(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Global.Mode != fake.ModeOK || !cfg.Global.Idempotent || len(cfg.Overrides)+len(cfg.Script) != 0 {
		t.Fatalf("config after reset = %+v, want the defaults", cfg)
	}
	if e := b.effects(t); e.Total != 0 || len(e.ByPolicy) != 0 {
		t.Fatalf("effects after reset = %+v", e)
	}
	b.wantTruth(t, "k", provider.TruthNotStarted)
}

func equal(a, b []provider.Outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
