package policies_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
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
	fake      *fake.Provider
	canceller *policies.Canceller
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
	t.Cleanup(func() { b.fake.Close(); srv.Close() })
	client := provider.NewHTTPClient(srv.URL, providerTimeout)
	t.Cleanup(client.CloseIdleConnections)
	b.canceller = policies.NewCanceller(db.Pool, client, 30*time.Second)

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

func (b *bundle) cancel(t *testing.T, policyID int64, key string) (policies.Operation, error) {
	t.Helper()
	return b.canceller.Cancel(context.Background(), policies.CancelRequest{
		UserID: b.alice, PolicyID: policyID, RequestKey: key, Reason: "moving abroad", Actor: "test " + key,
	}, workflow.Hooks[policies.Operation]{})
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
		{fake.ModeOK, policies.OpSucceeded, policies.StatusCancelled, 1, provider.TruthCompleted, policies.StepDone},
		{fake.ModeReject, policies.OpFailed, policies.StatusActive, 0, provider.TruthRejected, policies.StepFailed},
		{fake.ModeError, policies.OpInProgress, policies.StatusActive, 0, provider.TruthNotStarted, policies.StepUnknown},
		{fake.ModeDrop, policies.OpInProgress, policies.StatusActive, 0, provider.TruthNotStarted, policies.StepUnknown},
		{fake.ModeLostResponse, policies.OpInProgress, policies.StatusActive, 1, provider.TruthCompleted, policies.StepUnknown},
		{fake.ModeSlow, policies.OpInProgress, policies.StatusActive, 1, provider.TruthRunning, policies.StepUnknown},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t.Parallel()
			timeout := patient
			if tc.status == policies.OpInProgress && tc.mode != fake.ModeError {
				timeout = impatient // the provider holds the call until we give up
			}
			b := setupWithTimeout(t, timeout)
			b.setMode(t, tc.mode)
			pid := b.policyIDs[0]
			op, err := b.cancel(t, pid, "key-1")
			if err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			if op.Status != tc.status || op.Steps[policies.StepProviderCancel] != tc.step {
				t.Fatalf("operation %s, steps %v; want %s, provider_cancel %s", op.Status, op.Steps, tc.status, tc.step)
			}
			if got := b.policyStatus(t, pid); got != tc.policyStatus {
				t.Errorf("policy %s, want %s", got, tc.policyStatus)
			}
			if got := b.effects(t, pid); got != tc.effects {
				t.Errorf("provider effects %d, want %d", got, tc.effects)
			}
			truth, err := b.fake.Truth(context.Background(), op.ProviderKey)
			if err != nil || truth != tc.truth {
				t.Errorf("provider truth %s (%v), want %s", truth, err, tc.truth)
			}
			if op.Status == policies.OpInProgress {
				// Handed over: the lease is already over, so recovery claims it at once.
				if op.LeaseExpiresAt == nil || op.LeaseExpiresAt.After(time.Now().Add(time.Second)) || op.LastError == nil {
					t.Errorf("unknown outcome not handed over: lease %v, last_error %v", op.LeaseExpiresAt, op.LastError)
				}
			}
			events, err := b.store.Timeline(context.Background(), op.ID)
			if err != nil || len(events) != 2 || events[0].ToStatus != policies.OpInProgress || events[1].ToStatus != tc.status {
				t.Fatalf("timeline %+v, %v", events, err)
			}
			if events[1].Statement == "" || events[1].OwnerToken == nil || *events[1].OwnerToken != *op.OwnerToken {
				t.Errorf("event lacks its statement or owner: %+v", events[1])
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
	if err != nil || first.Status != policies.OpFailed {
		t.Fatalf("first: %+v %v", first, err)
	}
	b.setMode(t, fake.ModeOK)
	second, err := b.cancel(t, pid, "k2")
	if err != nil || second.Status != policies.OpSucceeded {
		t.Fatalf("second: %+v %v", second, err)
	}
	if second.ID != first.ID || second.Run != 2 || second.ProviderKey == first.ProviderKey {
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
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM policy_operations`).Scan(&n)
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
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM policy_operations WHERE policy_id = $1`, pid).Scan(&ops)
	if ops != 1 || b.effects(t, pid) != 1 {
		t.Fatalf("operations %d, effects %d", ops, b.effects(t, pid))
	}
}

// A request whose operation was taken over while it called the provider
// cannot record anything: its late write is fenced off and rolls back,
// including the answer it wanted to store with it.
func TestALateOwnerIsFencedOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[3]
	var op policies.Operation
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		op, err = b.store.StartCancellation(ctx, tx, b.alice, pid, "k", "", policies.Owner{ID: "request A", Lease: time.Second})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// Someone else takes over: a new owner token.
	if _, err := b.db.Pool.Exec(ctx, `UPDATE policy_operations SET owner_token = gen_random_uuid(), status = 'RECOVERING' WHERE id = $1`, op.ID); err != nil {
		t.Fatal(err)
	}
	finishRan := false
	_, err = b.canceller.Record(ctx, op.ID, *op.OwnerToken, "request A", provider.Result{Outcome: provider.Confirmed}, workflow.Hooks[policies.Operation]{
		Finish: func(context.Context, pgx.Tx, policies.Operation, error) error {
			finishRan = true
			return nil
		}})
	if !errors.Is(err, policies.ErrLeaseLost) {
		t.Fatalf("late Record: %v, want ErrLeaseLost", err)
	}
	if finishRan {
		t.Error("the answer was stored although the outcome was not")
	}
	if got := b.policyStatus(t, pid); got != policies.StatusActive {
		t.Errorf("policy %s after a fenced write", got)
	}
	events, _ := b.store.Timeline(ctx, op.ID)
	if len(events) != 1 {
		t.Errorf("fenced write left events: %+v", events)
	}
}

// Finish runs inside the outcome's transaction: when it fails, the outcome
// is not recorded either.
func TestFinishFailingRollsTheOutcomeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[4]
	boom := errors.New("boom")
	_, err := b.canceller.Cancel(context.Background(), policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "k", Actor: "t"},
		workflow.Hooks[policies.Operation]{Finish: func(context.Context, pgx.Tx, policies.Operation, error) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Cancel: %v", err)
	}
	op, err := b.store.OperationForPolicy(context.Background(), pid)
	if err != nil || op.Status != policies.OpInProgress || b.policyStatus(t, pid) != policies.StatusActive {
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
	var started policies.Operation
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		started, err = b.store.StartCancellation(ctx, tx, b.alice, pid, "key-k", "", policies.Owner{ID: "request that died", Lease: time.Minute})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var answered policies.Operation
	op, err := b.canceller.Cancel(ctx, policies.CancelRequest{UserID: b.alice, PolicyID: pid, RequestKey: "key-k", Actor: "retry"},
		workflow.Hooks[policies.Operation]{Finish: func(_ context.Context, _ pgx.Tx, op policies.Operation, _ error) error { answered = op; return nil }})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if op.ID != started.ID || op.Status != policies.OpInProgress || answered.ID != op.ID {
		t.Fatalf("retry got %+v (answered %+v)", op, answered)
	}
	if n := b.effects(t, pid); n != 0 {
		t.Fatalf("the retry called the provider: %d effects", n)
	}
	events, _ := b.store.Timeline(ctx, op.ID)
	if len(events) != 2 || events[1].Actor != "retry" {
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

func (tr *txTracer) hooks() workflow.Hooks[policies.Operation] {
	return workflow.Hooks[policies.Operation]{
		Begin: func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&tr.begin)
		},
		Finish: func(ctx context.Context, tx pgx.Tx, _ policies.Operation, refusal error) error {
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
	cancel := func(pid int64, key string, tr *txTracer) (policies.Operation, error) {
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
		workflow.Hooks[policies.Operation]{Begin: func(context.Context, pgx.Tx) error { return boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("Begin failing: %v", err)
	}
	if _, err := b.store.OperationForPolicy(ctx, b.policyIDs[1]); !errors.Is(err, policies.ErrOperationNotFound) {
		t.Fatalf("Begin failed, yet an operation exists: %v", err)
	}
}
