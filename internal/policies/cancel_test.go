package policies_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/payments"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/workflow"
)

// The workflow's patience. Modes that never answer cost one impatient
// timeout; modes that answer get a patient client, so a loaded machine
// (-race, packages in parallel) cannot turn an answer into a timeout.
const (
	impatient = 400 * time.Millisecond
	patient   = 10 * time.Second
)

type bundle struct {
	db        *testdb.DB
	store     *policies.Store
	engine    *workflow.Engine
	reg       *prometheus.Registry // the engine's metrics
	fake      *fake.Provider
	payments  *paymentsfake.Payments
	payURL    string
	canceller *policies.Canceller
	url       string // the fake provider's
	alice     int64
	policyIDs []int64 // alice's
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupWithTimeout(t, patient)
}

func setupWithTimeout(t *testing.T, providerTimeout time.Duration) *bundle {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	b := &bundle{db: db, store: policies.NewStore(db.Pool)}
	b.fake = fake.New(db.Pool, fake.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv := httptest.NewServer(b.fake.Handler())
	b.url = srv.URL
	t.Cleanup(func() { b.fake.Close(); srv.Close() })
	client := provider.NewHTTPClient(srv.URL, providerTimeout)
	t.Cleanup(client.CloseIdleConnections)
	b.payments = paymentsfake.New(db.Pool, paymentsfake.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	paySrv := httptest.NewServer(b.payments.Handler())
	t.Cleanup(func() { b.payments.Close(); paySrv.Close() })
	b.payURL = paySrv.URL
	pay := payments.NewHTTPClient(paySrv.URL, patient)
	t.Cleanup(pay.CloseIdleConnections)
	b.reg = prometheus.NewRegistry()
	b.engine = workflow.NewEngine(db.Pool, workflow.Config{Lease: 30 * time.Second, Registerer: b.reg})
	b.canceller = policies.NewCanceller(b.engine, client, pay, events.NewWriter(nil))

	if err := db.Pool.QueryRow(ctx, `SELECT id FROM users WHERE name = 'alice'`).Scan(&b.alice); err != nil {
		t.Fatal(err)
	}
	list, err := b.store.List(ctx, policies.ListFilter{UserID: b.alice, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		b.policyIDs = append(b.policyIDs, p.ID)
	}
	return b
}

func (b *bundle) setMode(t *testing.T, mode fake.Mode) {
	t.Helper()
	f := fake.DefaultFault()
	f.Mode = mode
	f.SlowMS = 5000
	if _, err := b.fake.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) cancel(t *testing.T, policyID int64, key string) (workflow.Operation, error) {
	t.Helper()
	return b.canceller.Cancel(context.Background(), policies.CancelRequest{
		UserID: b.alice, PolicyID: policyID, RequestKey: key, Reason: "moving abroad", Actor: "test " + key,
	}, workflow.Hooks[workflow.Operation]{})
}

// state is the state of op's step called name.
func state(op workflow.Operation, name string) string {
	s, _ := op.Step(name)
	return s.State
}

// providerKey is the key op's provider call carries.
func providerKey(op workflow.Operation) string {
	s, _ := op.Step(policies.StepProviderCancel)
	return s.Key
}

func (b *bundle) effects(t *testing.T, policyID int64) int {
	t.Helper()
	eff, err := b.fake.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, pe := range eff.ByPolicy {
		if pe.PolicyID == policyID {
			n += int(pe.Count + pe.Pending)
		}
	}
	return n
}

func (b *bundle) policyStatus(t *testing.T, policyID int64) string {
	t.Helper()
	p, err := b.store.Get(context.Background(), b.alice, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return p.Status
}

func TestCancellationOutcomeForEachProviderMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode         fake.Mode
		status       string
		policyStatus string
		effects      int
		truth        provider.Truth
		step         string
	}{
		{fake.ModeOK, workflow.StatusSucceeded, policies.StatusCancelled, 1, provider.TruthCompleted, workflow.StepDone},
		{fake.ModeReject, workflow.StatusFailed, policies.StatusActive, 0, provider.TruthRejected, workflow.StepFailed},
		{fake.ModeError, workflow.StatusInProgress, policies.StatusActive, 0, provider.TruthNotStarted, workflow.StepUnknown},
		{fake.ModeDrop, workflow.StatusInProgress, policies.StatusActive, 0, provider.TruthNotStarted, workflow.StepUnknown},
		{fake.ModeLostResponse, workflow.StatusInProgress, policies.StatusActive, 1, provider.TruthCompleted, workflow.StepUnknown},
		{fake.ModeSlow, workflow.StatusInProgress, policies.StatusActive, 1, provider.TruthRunning, workflow.StepUnknown},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			timeout := patient
			if tc.status == workflow.StatusInProgress && tc.mode != fake.ModeError {
				timeout = impatient // the provider holds the call until we give up
			}
			b := setupWithTimeout(t, timeout)
			b.setMode(t, tc.mode)
			pid := b.policyIDs[0]
			op, err := b.cancel(t, pid, "key-1")
			if err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			if op.Status != tc.status || state(op, policies.StepProviderCancel) != tc.step {
				t.Fatalf("operation %s, steps %v; want %s, provider_cancel %s", op.Status, op.Steps, tc.status, tc.step)
			}
			if got := b.policyStatus(t, pid); got != tc.policyStatus {
				t.Errorf("policy %s, want %s", got, tc.policyStatus)
			}
			if got := b.effects(t, pid); got != tc.effects {
				t.Errorf("provider effects %d, want %d", got, tc.effects)
			}
			truth, err := b.fake.Truth(context.Background(), providerKey(op))
			if err != nil || truth != tc.truth {
				t.Errorf("provider truth %s (%v), want %s", truth, err, tc.truth)
			}
			if op.Status == workflow.StatusInProgress {
				// Handed over: the lease is already over, so recovery claims it at once.
				if op.LeaseExpiresAt == nil || op.LeaseExpiresAt.After(time.Now().Add(time.Second)) || op.LastError == nil {
					t.Errorf("unknown outcome not handed over: lease %v, last_error %v", op.LeaseExpiresAt, op.LastError)
				}
			}
			events, err := readmodel.Timeline(context.Background(), b.db.Pool, op.ID)
			if err != nil || len(events) < 3 || events[0].ToStatus != workflow.StatusInProgress || events[len(events)-1].ToStatus != tc.status {
				t.Fatalf("timeline %+v, %v", events, err)
			}
			for _, e := range events {
				if e.Statement == "" || e.OwnerToken == nil || *e.OwnerToken != *op.OwnerToken {
					t.Errorf("event lacks its statement or owner: %+v", e)
				}
			}
		})
	}
}

func TestARefusedCancellationCanBeStartedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[1]
	b.setMode(t, fake.ModeReject)
	first, err := b.cancel(t, pid, "k1")
	if err != nil || first.Status != workflow.StatusFailed {
		t.Fatalf("first: %+v %v", first, err)
	}
	b.setMode(t, fake.ModeOK)
	second, err := b.cancel(t, pid, "k2")
	if err != nil || second.Status != workflow.StatusSucceeded {
		t.Fatalf("second: %+v %v", second, err)
	}
	if second.ID != first.ID || second.Run != 2 || providerKey(second) == providerKey(first) {
		t.Fatalf("restart should reuse the row with a new run and provider key: first %+v second %+v", first, second)
	}
	if _, err := b.cancel(t, pid, "k3"); !errors.Is(err, policies.ErrDuplicateIntent) {
		t.Fatalf("cancelling a cancelled policy: %v", err)
	}
	if got := b.effects(t, pid); got != 1 {
		t.Fatalf("effects %d", got)
	}
}

func TestUnknownAndForeignPoliciesAreNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var bobsPolicy int64
	b.db.Pool.QueryRow(context.Background(), `SELECT p.id FROM policies p JOIN users u ON u.id = p.user_id WHERE u.name = 'bob' LIMIT 1`).Scan(&bobsPolicy)
	for _, id := range []int64{bobsPolicy, 999999} {
		if _, err := b.cancel(t, id, "k"); !errors.Is(err, policies.ErrNotFound) {
			t.Errorf("policy %d: %v, want ErrNotFound", id, err)
		}
	}
	var n int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM operations`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d operations written", n)
	}
}

// Fifty requests with fifty different keys — a double-click storm — make one
// operation and at most one provider effect: business identity at work.
func TestConcurrentCancellationsWithDifferentKeysMakeOneOperation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[2]
	const n = 50
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var succeeded, duplicate int
	var other []error
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := b.cancel(t, pid, "click-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
			mu.Lock()
			defer mu.Unlock()
			var dup *policies.DuplicateIntentError
			switch {
			case err == nil:
				succeeded++
			case errors.As(err, &dup):
				duplicate++
			default:
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if succeeded != 1 || duplicate != n-1 || len(other) != 0 {
		t.Fatalf("succeeded %d, duplicate %d, other %v", succeeded, duplicate, other)
	}
	var ops int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM operations WHERE policy_id = $1`, pid).Scan(&ops)
	if ops != 1 || b.effects(t, pid) != 1 {
		t.Fatalf("operations %d, effects %d", ops, b.effects(t, pid))
	}
}

// A request whose operation was taken over while it called the provider
// cannot record anything: its late write is fenced off and rolls back,
// including the answer it wanted to store with it — and the refusal is
// counted on the timeline.
func TestALateOwnerIsFencedOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[3]
	f := fake.DefaultFault()
	f.Mode, f.SlowMS = fake.ModeSlow, 1500 // the provider holds the request's call for 1.5 s, then confirms
	if _, err := b.fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	finishRan := false
	done := make(chan error, 1)
	go func() {
		_, err := b.canceller.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "k", Actor: "request A"},
			workflow.Hooks[workflow.Operation]{Finish: func(context.Context, pgx.Tx, workflow.Operation, error) error {
				finishRan = true
				return nil
			}})
		done <- err
	}()
	// While A waits for the provider, recovery on another instance sees
	// A's lease as over (the clock moved past it) and takes the operation.
	var claimed []recovery.Claim
	deadline := time.Now().Add(5 * time.Second)
	for len(claimed) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		b.engine.Clock().Set(time.Now().Add(time.Hour))
		var err error
		claimed, err = b.engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.SkipLocked, Actor: "recovery on app-2", Lease: time.Minute, Limit: 1})
		b.engine.Clock().Reset()
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(claimed) != 1 || claimed[0].Reason == "" {
		t.Fatalf("claims %+v", claimed)
	}
	if err := <-done; !errors.Is(err, workflow.ErrLeaseLost) {
		t.Fatalf("the late owner's Cancel: %v, want ErrLeaseLost", err)
	}
	if finishRan {
		t.Error("the answer was stored although the outcome was not")
	}
	if got := b.policyStatus(t, pid); got != policies.StatusActive {
		t.Errorf("policy %s after a fenced write", got)
	}
	op, err := b.engine.OperationOf(ctx, policies.OperationCancel, pid)
	if err != nil || op.Status != workflow.StatusRecovering || state(op, policies.StepProviderCancel) != workflow.StepSent {
		t.Fatalf("after the fenced write: %+v %v", op, err)
	}
	events, _ := readmodel.Timeline(ctx, b.db.Pool, op.ID)
	last := events[len(events)-1]
	if last.Branch == nil || *last.Branch != workflow.BranchFenced || last.Actor != "request A" {
		t.Errorf("the refusal is not on the timeline: %+v", last)
	}
	if n := counter(t, b.reg, "idemlab_workflow_fenced_writes_total"); n != 1 {
		t.Errorf("fenced writes counted: %v, want 1", n)
	}
}

// Finish runs inside the last outcome's transaction: when it fails, that
// outcome is not recorded either.
func TestFinishFailingRollsTheOutcomeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[4]
	boom := errors.New("boom")
	_, err := b.canceller.Cancel(context.Background(), policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "k", Actor: "t"},
		workflow.Hooks[workflow.Operation]{Finish: func(context.Context, pgx.Tx, workflow.Operation, error) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Cancel: %v", err)
	}
	// Finish runs in the last transaction (the refund's outcome): that one
	// rolled back; the ones before it stand, recovery finishes the rest.
	op, err := b.engine.OperationOf(context.Background(), policies.OperationCancel, pid)
	if err != nil || op.Status != workflow.StatusInProgress || state(op, policies.StepRefund) != workflow.StepSent ||
		state(op, policies.StepAudit) != workflow.StepPending || b.policyStatus(t, pid) != policies.StatusCancelled {
		t.Fatalf("after a failed finish: %+v %v, policy %s", op, err, b.policyStatus(t, pid))
	}
}

// A request that died after claiming its operation, retried with the same
// key, is answered with the operation's state: it is not refused as a
// duplicate, and the provider is not called again by the request.
func TestTheSameRequestRetriedGetsTheOperationAsItIs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[0]
	sw := crash.New(policies.CrashPoints, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := sw.Arm(crash.Setting{At: "after_claim", Mode: crash.Abandon, Once: true}); err != nil {
		t.Fatal(err)
	}
	engine := workflow.NewEngine(b.db.Pool, workflow.Config{Lease: time.Minute, Crash: sw})
	dying := policies.NewCanceller(engine, provider.NewHTTPClient(b.url, patient), payments.NewHTTPClient(b.payURL, patient), events.NewWriter(sw))
	func() {
		defer func() { recover() }() // the crash point abandons the request
		dying.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "key-k", Actor: "request that died"},
			workflow.Hooks[workflow.Operation]{})
		t.Fatal("the crash point did not fire")
	}()
	started, err := b.engine.OperationOf(ctx, policies.OperationCancel, pid)
	if err != nil || state(started, policies.StepProviderCancel) != workflow.StepSent {
		t.Fatalf("after the crash: %+v %v", started, err)
	}
	var answered workflow.Operation
	op, err := b.canceller.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "key-k", Actor: "retry"},
		workflow.Hooks[workflow.Operation]{Finish: func(_ context.Context, _ pgx.Tx, op workflow.Operation, _ error) error { answered = op; return nil }})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if op.ID != started.ID || op.Status != workflow.StatusInProgress || answered.ID != op.ID {
		t.Fatalf("retry got %+v (answered %+v)", op, answered)
	}
	if n := b.effects(t, pid); n != 0 {
		t.Fatalf("the retry called the provider: %d effects", n)
	}
	events, _ := readmodel.Timeline(ctx, b.db.Pool, op.ID)
	if last := events[len(events)-1]; last.Actor != "retry" {
		t.Fatalf("timeline %+v", events)
	}
	// Another key is still a duplicate intent.
	if _, err := b.cancel(t, pid, "other-key"); !errors.Is(err, policies.ErrDuplicateIntent) {
		t.Fatalf("other key: %v", err)
	}
}

// txTracer records, for workflow.Hooks, the transaction each hook ran in and
// what Finish was given.
type txTracer struct {
	begin, finish int64
	refusal       error
	finishes      int
}

func (tr *txTracer) hooks() workflow.Hooks[workflow.Operation] {
	return workflow.Hooks[workflow.Operation]{
		Begin: func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&tr.begin)
		},
		Finish: func(ctx context.Context, tx pgx.Tx, _ workflow.Operation, refusal error) error {
			tr.finishes++
			tr.refusal = refusal
			return tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&tr.finish)
		},
	}
}

// The hooks' contract: Begin runs in transaction 1; a refusal decided there
// (not found, a duplicate intent) reaches Finish in that same transaction,
// which commits once; a provider outcome reaches Finish in the transaction
// that records it.
func TestHooksRefusalsCommitWithTheClaimOutcomesWithTheirRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	committed := func(txid int64) bool {
		t.Helper()
		var st string
		if err := b.db.Pool.QueryRow(ctx, `SELECT txid_status($1)`, txid).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st == "committed"
	}
	cancel := func(pid int64, key string, tr *txTracer) (workflow.Operation, error) {
		return b.canceller.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: key, Actor: "t"}, tr.hooks())
	}

	var ok txTracer
	if _, err := cancel(b.policyIDs[0], "first", &ok); err != nil {
		t.Fatal(err)
	}
	if ok.finishes != 1 || ok.refusal != nil || ok.finish == ok.begin || !committed(ok.begin) || !committed(ok.finish) {
		t.Errorf("provider outcome: %+v, want Finish once, in its own committed transaction after Begin's", ok)
	}

	for name, tc := range map[string]struct {
		pid  int64
		want error
	}{
		"not found":        {999999, policies.ErrNotFound},
		"duplicate intent": {b.policyIDs[0], policies.ErrDuplicateIntent},
	} {
		var tr txTracer
		_, err := cancel(tc.pid, "another-"+name, &tr)
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", name, err, tc.want)
		}
		if tr.finishes != 1 || !errors.Is(tr.refusal, tc.want) || tr.finish != tr.begin || !committed(tr.begin) {
			t.Errorf("%s: %+v, want the refusal given to Finish in Begin's transaction, committed", name, tr)
		}
	}

	// Begin failing ends the workflow with nothing written.
	boom := errors.New("boom")
	_, err := b.canceller.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: b.policyIDs[1], RequestKey: "k", Actor: "t"},
		workflow.Hooks[workflow.Operation]{Begin: func(context.Context, pgx.Tx) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Begin failing: %v", err)
	}
	if _, err := b.engine.OperationOf(ctx, policies.OperationCancel, b.policyIDs[1]); !errors.Is(err, workflow.ErrNotFound) {
		t.Fatalf("Begin failed, yet an operation exists: %v", err)
	}
}

// A step's key is derived from the operation and the step, so it is the
// same on every retry (the request's call, then recovery's after
// NOT_STARTED), after a crash, after a restart of the process (a new
// engine, pool and clients), and when the recovery loop makes the call
// instead of the request: every call row, and each system's record, carry it.
func TestStepKeysAreTheSameWhoeverMakesTheCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// A: the provider answers the request's call with a 503 (nothing
	// applied): the request hands over.
	retried := b.policyIDs[2]
	f := fake.DefaultFault()
	f.Mode, f.Next = fake.ModeError, 1
	if _, err := b.fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	if op, err := b.cancel(t, retried, "request-a"); err != nil || state(op, policies.StepProviderCancel) != workflow.StepUnknown {
		t.Fatalf("A: %+v %v", op, err)
	}
	// B: the request dies after committing the refund's SENT, before the call.
	crashed := b.policyIDs[3]
	sw := crash.New(policies.CrashPoints, quiet)
	if err := sw.Arm(crash.Setting{At: "before_refund", Mode: crash.Abandon, Once: true}); err != nil {
		t.Fatal(err)
	}
	dying := policies.NewCanceller(workflow.NewEngine(b.db.Pool, workflow.Config{Lease: time.Minute, Crash: sw}),
		provider.NewHTTPClient(b.url, patient), payments.NewHTTPClient(b.payURL, patient), events.NewWriter(sw))
	func() {
		defer func() { recover() }() // the crash point abandons the request
		dying.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: crashed, RequestKey: "request-b", Actor: "request B"},
			workflow.Hooks[workflow.Operation]{})
		t.Fatal("the crash point did not fire")
	}()

	// "Restart": another engine, pool and clients, as a new process has; its
	// recovery loop makes every call that is left.
	pool, err := database.Open(ctx, b.db.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	restarted := workflow.NewEngine(pool, workflow.Config{})
	policies.NewCanceller(restarted, provider.NewHTTPClient(b.url, patient), payments.NewHTTPClient(b.payURL, patient), events.NewWriter(nil))
	cfg := recovery.DefaultConfig()
	cfg.ClockSkew, cfg.Logger = 0, quiet
	loop := recovery.New(restarted, cfg)
	loop.Register(policies.OperationCancel, restarted)
	restarted.Clock().Set(time.Now().Add(time.Minute)) // B's lease (and every deadline) is over
	for range 10 {
		if _, err := loop.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}

	for _, pid := range []int64{retried, crashed} {
		op, err := b.engine.OperationOf(ctx, policies.OperationCancel, pid)
		if err != nil || op.Status != workflow.StatusSucceeded {
			t.Fatalf("policy %d after recovery: %+v %v", pid, op, err)
		}
		for _, step := range []string{policies.StepProviderCancel, policies.StepRefund} {
			want := workflow.StepKey(op.ID, step, 1)
			rec, _ := op.Step(step)
			var calls int
			var keys []string
			rows, _ := b.db.Pool.Query(ctx, `
				SELECT DISTINCT step_key FROM operation_calls WHERE operation_id = $1 AND step_key LIKE '%:' || $2`, op.ID, step)
			keys, _ = pgx.CollectRows(rows, pgx.RowTo[string])
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_calls WHERE step_key = $1 AND kind = 'call'`, want).Scan(&calls)
			if rec.Key != want || len(keys) != 1 || keys[0] != want {
				t.Errorf("policy %d %s: key %s, calls under %v; want %s", pid, step, rec.Key, keys, want)
			}
			// Two calls recorded where a second attempt was made: A's provider
			// call, and B's refund (recorded SENT by the request that died
			// before sending it, then sent by recovery).
			second := (pid == retried && step == policies.StepProviderCancel) || (pid == crashed && step == policies.StepRefund)
			if wantCalls := map[bool]int{true: 2, false: 1}[second]; calls != wantCalls {
				t.Errorf("policy %d %s: %d calls, want %d", pid, step, calls, wantCalls)
			}
		}
		var atProvider, atPayments string
		b.db.Pool.QueryRow(ctx, `SELECT string_agg(idempotency_key, ',') FROM fake_provider.requests WHERE policy_id = $1`, pid).Scan(&atProvider)
		b.db.Pool.QueryRow(ctx, `SELECT string_agg(idempotency_key, ',') FROM fake_payments.refunds WHERE policy_id = $1`, pid).Scan(&atPayments)
		if atProvider != workflow.StepKey(op.ID, policies.StepProviderCancel, 1) || atPayments != workflow.StepKey(op.ID, policies.StepRefund, 1) {
			t.Errorf("policy %d: the provider saw %q, payments %q", pid, atProvider, atPayments)
		}
	}
}

// The delayed original (issue 11, item 1): the request's call to a provider
// that is not idempotent is held in the network past the client's timeout.
// Recovery asks at once and hears NOT_STARTED — but that answer describes
// the past: the original is still on its way. So recovery waits until the
// call's deadline plus the clock-skew margin before it sends the call
// again; the held original arrives after its deadline and is refused; the
// provider cancels the policy once.
func TestADelayedOriginalIsNotAppliedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[4]
	f := fake.DefaultFault()
	f.Idempotent = false
	if _, err := b.fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := recovery.SetBelief(ctx, b.db.Pool, "provider", false, "the test"); err != nil {
		t.Fatal(err)
	}
	proxy, err := netfault.Listen(strings.TrimPrefix(b.url, "http://"), netfault.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	const timeout, held, skew = 400 * time.Millisecond, 1500 * time.Millisecond, 700 * time.Millisecond
	engine := workflow.NewEngine(b.db.Pool, workflow.Config{Lease: 30 * time.Second})
	c := policies.NewCanceller(engine, provider.NewHTTPClient(proxy.URL(), timeout), payments.NewHTTPClient(b.payURL, patient), events.NewWriter(nil))
	proxy.HoldNext(1, held, "POST ") // the request's call, and only it

	op, err := c.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "k", Actor: "request"},
		workflow.Hooks[workflow.Operation]{})
	if err != nil || state(op, policies.StepProviderCancel) != workflow.StepUnknown {
		t.Fatalf("the request: %+v %v", op, err)
	}
	// Recovery, at once, through the same proxy (healed of its hold).
	cfg := recovery.DefaultConfig()
	cfg.ClockSkew, cfg.Logger = skew, slog.New(slog.NewTextHandler(io.Discard, nil))
	loop := recovery.New(engine, cfg)
	loop.Register(policies.OperationCancel, engine)
	// Bounded by time, not by passes: on a loaded machine a pass's call can
	// outlive its 400 ms too, and recovery then waits out the skew again.
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		if _, err := loop.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if op, _ = b.engine.GetOperation(ctx, op.ID, 0, true); op.Terminal() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if op.Status != workflow.StatusSucceeded {
		t.Fatalf("after recovery: %s (%+v)", op.Status, op)
	}
	// The held original reaches the provider after its deadline (the proxy
	// delivers it 1.5 s after it was sent): wait for it, then count.
	key := workflow.StepKey(op.ID, policies.StepProviderCancel, 1)
	var late int
	for end := time.Now().Add(5 * time.Second); late == 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fault.late_arrivals WHERE system = 'provider' AND idempotency_key = $1`, key).Scan(&late)
	}
	if late != 1 {
		t.Errorf("late arrivals of %s: %d, want the held original refused once", key, late)
	}
	if n := b.effects(t, pid); n != 1 {
		t.Fatalf("provider effects %d: the policy was cancelled %d times", n, n)
	}
	// Recovery's own rule: it waited for the first call's deadline + skew
	// before sending again.
	var firstDeadline, resent time.Time
	b.db.Pool.QueryRow(ctx, `
		SELECT min(deadline_at) FILTER (WHERE attempt = 1), min(at) FILTER (WHERE attempt = 2)
		  FROM operation_calls WHERE step_key = $1 AND kind = 'call'`, key).Scan(&firstDeadline, &resent)
	if resent.Before(firstDeadline.Add(skew)) {
		t.Errorf("resent at %s, before the first call's deadline %s + %s", resent, firstDeadline, skew)
	}
	branches := map[string]bool{}
	events, _ := readmodel.Timeline(ctx, b.db.Pool, op.ID)
	for _, e := range events {
		if e.Branch != nil {
			branches[*e.Branch] = true
		}
	}
	if !branches[workflow.BranchNotStartedWait] || !branches[workflow.BranchNotStarted] {
		t.Errorf("branches %v: want a wait on NOT_STARTED, then the resend", branches)
	}
}

// counter reads a counter's total (every label) from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
