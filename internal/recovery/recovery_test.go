package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/workflow"
)

// providerTimeout is every client's patience: short so timeouts are cheap,
// long enough that an answered call is not mistaken for one under -race.
const providerTimeout = 300 * time.Millisecond

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type bundle struct {
	db        *testdb.DB
	store     *policies.Store
	fake      *fake.Provider
	url       string
	timeout   time.Duration // the loops' provider timeout: patient, so a loaded test machine does not divert a case into backoff
	canceller *policies.Canceller
	alice     int64
	policyIDs []int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	b := &bundle{db: db, store: policies.NewStore(db.Pool)}
	b.fake = fake.New(db.Pool, fake.Options{Logger: quiet})
	srv := httptest.NewServer(b.fake.Handler())
	t.Cleanup(func() { b.fake.Close(); srv.Close() })
	b.url, b.timeout = srv.URL, 2*time.Second
	b.canceller = policies.NewCanceller(db.Pool, b.client(t), 30*time.Second)
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM users WHERE name = 'alice'`).Scan(&b.alice); err != nil {
		t.Fatal(err)
	}
	list, err := b.store.List(ctx, policies.ListFilter{UserID: b.alice, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		b.policyIDs = append(b.policyIDs, p.ID)
	}
	return b
}

func (b *bundle) client(t *testing.T) *provider.HTTPClient {
	c := provider.NewHTTPClient(b.url, providerTimeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// loop returns a recovery loop over b's database, as instance name. Each
// loop gets its own pool, provider client and canceller, as a separate
// process would.
func (b *bundle) loop(t *testing.T, name string, cfg recovery.Config) *recovery.Loop {
	t.Helper()
	pool, err := database.Open(context.Background(), b.db.URL, 4) // frugal: the server allows 100 connections for every test running
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := provider.NewHTTPClient(b.url, b.timeout)
	t.Cleanup(client.CloseIdleConnections)
	rec := policies.NewRecovery(policies.NewCanceller(pool, client, 30*time.Second))
	cfg.Instance = name
	cfg.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 50 * time.Millisecond
	}
	l := recovery.New(rec, cfg)
	l.Register(policies.OperationCancel, rec)
	return l
}

type faults struct {
	mode       fake.Mode
	idempotent bool
	statusMode fake.StatusMode
}

func (b *bundle) setFaults(t *testing.T, f faults) {
	t.Helper()
	fault := fake.DefaultFault()
	fault.Mode, fault.Idempotent, fault.SlowMS = f.mode, f.idempotent, 800
	if f.statusMode != "" {
		fault.StatusMode = f.statusMode
	}
	if _, err := b.fake.SetFaults(context.Background(), fault); err != nil {
		t.Fatal(err)
	}
}

// crashed is what the Crash hook panics with: the request "died" there.
type crashed struct{}

// cancelCrashingAt runs a real cancellation that dies at point (none: it
// runs to the end), and returns the operation as the database has it.
func (b *bundle) cancelCrashingAt(t *testing.T, policyID int64, point policies.CrashPoint) policies.Operation {
	t.Helper()
	ctx := context.Background()
	b.canceller.Crash = func(_ context.Context, at policies.CrashPoint) {
		if at == point {
			panic(crashed{})
		}
	}
	func() {
		defer func() {
			if r := recover(); r != nil && r != (crashed{}) {
				panic(r)
			}
		}()
		_, err := b.canceller.Cancel(ctx, policies.CancelRequest{
			UserID: b.alice, PolicyID: policyID, RequestKey: "key-" + string(point), Actor: "request on app-1",
		}, workflow.Hooks[policies.Operation]{})
		if err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}()
	op, err := b.store.OperationForPolicy(ctx, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// settle runs passes of l until every operation is terminal.
func (b *bundle) settle(t *testing.T, l *recovery.Loop) recovery.Counts {
	t.Helper()
	var total recovery.Counts
	for range 30 {
		c, err := l.RunOnce(context.Background())
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		total = add(total, c)
		if b.live(t) == 0 {
			return total
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("operations still live after 30 passes: %d", b.live(t))
	return total
}

func (b *bundle) live(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM policy_operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func add(a, c recovery.Counts) recovery.Counts {
	a.Claimed += c.Claimed
	a.Succeeded += c.Succeeded
	a.Failed += c.Failed
	a.Reconcile += c.Reconcile
	a.BackedOff += c.BackedOff
	a.Fenced += c.Fenced
	a.Errors += c.Errors
	a.Polls += c.Polls
	return a
}

func (b *bundle) effects(t *testing.T, policyID int64) int {
	t.Helper()
	eff, err := b.fake.Effects(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, pe := range eff.ByPolicy {
		if pe.PolicyID == policyID {
			return int(pe.Count + pe.Pending)
		}
	}
	return 0
}

// checkInvariants runs DESIGN.md's invariants (internal/invariants)
// against the app's tables and the provider's ledger.
func checkInvariants(t *testing.T, db *testdb.DB) {
	t.Helper()
	r, err := invariants.Check(context.Background(), db.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant %d: %s (ids %v)", v.Invariant, v.Detail, v.IDs)
	}
}

// Every provider mode × every crash point of a cancellation ends, after
// recovery with the faults switched off, in the documented terminal state
// with at most one provider effect.
func TestEveryModeAndCrashPointEndsInItsDocumentedState(t *testing.T) {
	t.Parallel()
	const (
		none        = policies.CrashPoint("none")
		afterClaim  = policies.CrashAfterClaim
		afterCall   = policies.CrashAfterProviderCall
		afterCommit = policies.CrashAfterCommit
	)
	type want struct {
		status  string
		effects int
		branch  string // the branch recovery took; "" = nothing to recover
	}
	succeededAfterRetry := want{policies.OpSucceeded, 1, policies.BranchNotStarted}
	for _, tc := range []struct {
		mode  fake.Mode
		crash policies.CrashPoint
		want  want
	}{
		{fake.ModeOK, none, want{policies.OpSucceeded, 1, ""}},
		{fake.ModeOK, afterClaim, succeededAfterRetry},
		{fake.ModeOK, afterCall, want{policies.OpSucceeded, 1, policies.BranchCompleted}},
		{fake.ModeOK, afterCommit, want{policies.OpSucceeded, 1, ""}},

		{fake.ModeReject, none, want{policies.OpFailed, 0, ""}},
		{fake.ModeReject, afterClaim, succeededAfterRetry}, // the refusal never happened; the retry meets a healthy provider
		{fake.ModeReject, afterCall, want{policies.OpFailed, 0, policies.BranchRejected}},
		{fake.ModeReject, afterCommit, want{policies.OpFailed, 0, ""}},

		{fake.ModeError, none, succeededAfterRetry},
		{fake.ModeError, afterClaim, succeededAfterRetry},
		{fake.ModeError, afterCall, succeededAfterRetry},
		{fake.ModeError, afterCommit, succeededAfterRetry},

		{fake.ModeDrop, none, succeededAfterRetry},
		{fake.ModeDrop, afterClaim, succeededAfterRetry},
		{fake.ModeDrop, afterCall, succeededAfterRetry},
		{fake.ModeDrop, afterCommit, succeededAfterRetry},

		{fake.ModeLostResponse, none, want{policies.OpSucceeded, 1, policies.BranchCompleted}},
		{fake.ModeLostResponse, afterClaim, succeededAfterRetry},
		{fake.ModeLostResponse, afterCall, want{policies.OpSucceeded, 1, policies.BranchCompleted}},
		{fake.ModeLostResponse, afterCommit, want{policies.OpSucceeded, 1, policies.BranchCompleted}},

		{fake.ModeSlow, none, want{policies.OpSucceeded, 1, policies.BranchCompleted}}, // after polling while RUNNING
		{fake.ModeSlow, afterClaim, succeededAfterRetry},
		{fake.ModeSlow, afterCall, want{policies.OpSucceeded, 1, policies.BranchCompleted}},
		{fake.ModeSlow, afterCommit, want{policies.OpSucceeded, 1, policies.BranchCompleted}},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.mode, tc.crash), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pid := b.policyIDs[0]
			b.setFaults(t, faults{mode: tc.mode, idempotent: true})
			before := b.cancelCrashingAt(t, pid, tc.crash)

			b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true}) // faults off
			l := b.loop(t, "app-2", recovery.Config{Lease: 2 * time.Second, MaxPolls: 6})
			// A crashed request's 30s lease has not run out yet: recovery
			// leaves the operation alone until it does…
			// (a handed-over one is claimed at once).
			first, err := l.RunOnce(context.Background())
			if err != nil || (before.LeaseExpiresAt.After(time.Now().Add(time.Second)) && first.Claimed != 0) {
				t.Fatalf("first pass claimed %+v (%v) an operation whose lease was running", first, err)
			}
			// …then takes it over (time moved past the lease, not slept).
			l.SetNow(ptr(time.Now().Add(31 * time.Second)))
			counts := add(first, b.settle(t, l))

			op, err := b.store.OperationForPolicy(context.Background(), pid)
			if err != nil {
				t.Fatal(err)
			}
			if op.Status != tc.want.status {
				t.Errorf("status %s, want %s (last error %v)", op.Status, tc.want.status, deref(op.LastError))
			}
			if got := b.effects(t, pid); got != tc.want.effects {
				t.Errorf("provider effects %d, want %d", got, tc.want.effects)
			}
			branches := b.branches(t, op.ID)
			if tc.want.branch == "" && counts.Claimed != 0 {
				t.Errorf("recovery claimed a finished operation: %+v, branches %v", counts, branches)
			}
			if tc.want.branch != "" && (counts.Claimed != 1 || !contains(branches, tc.want.branch)) {
				t.Errorf("claims %d, branches %v; want one claim and branch %s", counts.Claimed, branches, tc.want.branch)
			}
			checkInvariants(t, b.db)
		})
	}
}

// branches lists the recovery branches on an operation's timeline.
func (b *bundle) branches(t *testing.T, opID int64) []string {
	t.Helper()
	events, err := b.store.Timeline(context.Background(), opID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range events {
		if e.Branch != nil {
			out = append(out, *e.Branch)
		}
	}
	return out
}

// A provider that is not idempotent lost its answer, and its status cannot
// be asked: recovery must not call again (that could cancel twice), so the
// operation goes to reconciliation and the effect count stays 1.
func TestNotIdempotentLostResponseGoesToReconciliation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
	op := b.cancelCrashingAt(t, pid, "none")
	if op.Status != policies.OpInProgress {
		t.Fatalf("after a lost response: %s", op.Status)
	}
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
	no := false
	l := b.loop(t, "app-2", recovery.Config{Lease: 2 * time.Second, MaxPolls: 2, RetryUnknown: &no})
	c := b.settle(t, l)
	op, _ = b.store.OperationForPolicy(context.Background(), pid)
	if op.Status != policies.OpNeedsReconciliation || c.Reconcile != 1 || c.Polls != 2 {
		t.Fatalf("status %s, counts %+v; want NEEDS_RECONCILIATION after 2 polls", op.Status, c)
	}
	if got := b.effects(t, pid); got != 1 {
		t.Fatalf("effects %d, want 1", got)
	}
	if op.LastError == nil || op.ProviderTruth != nil {
		t.Errorf("evidence missing: last_error %v, provider_truth %v", deref(op.LastError), deref(op.ProviderTruth))
	}
	// Nothing more happens to it by itself.
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("a NEEDS_RECONCILIATION operation was claimed: %+v", c)
	}
	checkInvariants(t, b.db)
}

// The same lost answer on a provider whose status can be asked: recovery
// asks first, learns COMPLETED, and finishes without a second call.
func TestNotIdempotentLostResponseWithStatusFinishesWithoutASecondCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
	b.cancelCrashingAt(t, pid, "none")
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false})
	no := false
	b.settle(t, b.loop(t, "app-2", recovery.Config{Lease: 2 * time.Second, RetryUnknown: &no}))
	op, _ := b.store.OperationForPolicy(context.Background(), pid)
	if op.Status != policies.OpSucceeded || b.effects(t, pid) != 1 {
		t.Fatalf("status %s, effects %d", op.Status, b.effects(t, pid))
	}
	checkInvariants(t, b.db)
}

// A provider that cannot be reached at all: each attempt backs off (the
// operation stays RECOVERING with a next attempt time), and after
// MaxAttempts it goes to reconciliation with the evidence.
func TestUnreachableProviderBacksOffThenReconciles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeDrop, idempotent: true, statusMode: fake.StatusError})
	b.cancelCrashingAt(t, pid, "none") // attempt 1: the request's own, handed over
	l := b.loop(t, "app-2", recovery.Config{Lease: 2 * time.Second, MaxPolls: 1, MaxAttempts: 3, Backoff: time.Hour, MaxBackoff: 2 * time.Hour})

	c, err := l.RunOnce(context.Background())
	if err != nil || c.BackedOff != 1 {
		t.Fatalf("first pass %+v %v; want a backoff", c, err)
	}
	op, _ := b.store.OperationForPolicy(context.Background(), pid)
	if op.Status != policies.OpRecovering || op.Attempts != 2 || op.NextAttemptAt == nil || time.Until(*op.NextAttemptAt) < 30*time.Minute {
		t.Fatalf("after a backoff: %s attempts %d next %v", op.Status, op.Attempts, op.NextAttemptAt)
	}
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("claimed during its backoff: %+v", c)
	}
	l.SetNow(ptr(time.Now().Add(3 * time.Hour)))
	c, err = l.RunOnce(context.Background())
	if err != nil || c.Reconcile != 1 {
		t.Fatalf("second attempt %+v %v; want reconciliation", c, err)
	}
	op, _ = b.store.OperationForPolicy(context.Background(), pid)
	if op.Status != policies.OpNeedsReconciliation || op.Attempts != 3 {
		t.Fatalf("%s attempts %d", op.Status, op.Attempts)
	}
	if got := b.branches(t, op.ID); !contains(got, policies.BranchBackoff) || got[len(got)-1] != policies.BranchReconciliation {
		t.Fatalf("branches %v", got)
	}
}

// Three loops on one database and 300 stale operations: every operation is
// claimed exactly once, for both strategies.
func TestThreeLoopsRecoverEachOperationExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, strategy := range []recovery.Strategy{recovery.SkipLocked, recovery.Transition} {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Patient clients: 75 concurrent calls under -race must not time
			// out, or backoffs would add legitimate second claims.
			b.timeout = 10 * time.Second
			ctx := context.Background()
			const n = 300
			// 300 policies, each with a cancellation whose owner died
			// before calling the provider: IN_PROGRESS, lease over.
			_, err := b.db.Pool.Exec(ctx, `
				WITH p AS (
				    INSERT INTO policies (user_id, number, holder, premium)
				    SELECT $1, 'POL-LOAD-' || i, 'Load Test', 10
				      FROM generate_series(1, $2) i
				    RETURNING id, user_id)
				INSERT INTO policy_operations (policy_id, operation_type, user_id, idempotency_key, status,
				                               owner_token, owner_id, lease_expires_at, provider_key)
				SELECT id, 'CANCEL', user_id, 'k-' || id, 'IN_PROGRESS',
				       gen_random_uuid(), 'request on a dead instance', now() - interval '1 second',
				       format('policy-%s-cancel-1', id)
				  FROM p`, b.alice, n)
			if err != nil {
				t.Fatal(err)
			}
			loops := []*recovery.Loop{}
			for i := range 3 {
				loops = append(loops, b.loop(t, fmt.Sprintf("app-%d", i+1), recovery.Config{Strategy: strategy, BatchSize: 25}))
			}
			var mu sync.Mutex
			var total recovery.Counts
			start := make(chan struct{})
			var wg sync.WaitGroup
			for _, l := range loops {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 100 {
						c, err := l.RunOnce(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						total = add(total, c)
						mu.Unlock()
						if c.Claimed == 0 && b.live(t) == 0 {
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()

			if total.Claimed != n || total.Succeeded != n {
				t.Fatalf("counts %+v; want %d claimed and succeeded", total, n)
			}
			var claimedTwice, claimEvents, perLoop int
			b.db.Pool.QueryRow(ctx, `
				SELECT count(*) FROM (
				    SELECT operation_id FROM operation_events WHERE branch = 'claimed'
				     GROUP BY operation_id HAVING count(*) <> 1) x`).Scan(&claimedTwice)
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE branch = 'claimed'`).Scan(&claimEvents)
			b.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT actor) FROM operation_events WHERE branch = 'claimed'`).Scan(&perLoop)
			if claimedTwice != 0 || claimEvents != n {
				t.Fatalf("%d operations not claimed exactly once; %d claim events", claimedTwice, claimEvents)
			}
			t.Logf("%s: %d claims spread over %d loops", strategy, claimEvents, perLoop)
			var succeeded, effects int
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM policy_operations WHERE status = 'SUCCEEDED'`).Scan(&succeeded)
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.effects`).Scan(&effects)
			if succeeded != n || effects != n {
				t.Fatalf("succeeded %d, effects %d; want %d each", succeeded, effects, n)
			}
			checkInvariants(t, b.db)
		})
	}
}

// A worker whose lease ran out while it polled (a long GC pause, a
// partition) is fenced: another worker claims the operation, and nothing
// the first one tries to write afterwards lands.
func TestAWorkerWhoseLeaseLapsedMidPollIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[0]
	fault := fake.DefaultFault()
	fault.Mode, fault.SlowMS = fake.ModeSlow, 2000
	if _, err := b.fake.SetFaults(ctx, fault); err != nil {
		t.Fatal(err)
	}
	op := b.cancelCrashingAt(t, pid, "none") // RUNNING at the provider for 2s; handed over
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true})

	// A waits long between polls, so B takes over inside A's first wait
	// however slow the machine is; B polls briskly until the provider
	// completes. When A wakes up, the operation is no longer its own.
	a := b.loop(t, "app-1", recovery.Config{Lease: time.Second, MaxPolls: 10, PollInterval: 3 * time.Second})
	bb := b.loop(t, "app-2", recovery.Config{Lease: time.Second, MaxPolls: 10, PollInterval: 150 * time.Millisecond})
	aDone := make(chan recovery.Counts, 1)
	go func() {
		c, err := a.RunOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		aDone <- c
	}()
	// Wait until worker A is polling…
	waitFor(t, 5*time.Second, func() bool {
		var n int
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE operation_id = $1 AND branch = 'poll'`, op.ID).Scan(&n)
		return n > 0
	})
	// …then B, whose clock says A's lease is long over, takes over.
	bb.SetNow(ptr(time.Now().Add(time.Hour)))
	cb, err := bb.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ca := <-aDone
	if cb.Claimed != 1 || cb.Succeeded != 1 || ca.Fenced != 1 || ca.Succeeded != 0 {
		t.Fatalf("A %+v, B %+v; want A fenced and B finishing", ca, cb)
	}
	var takeover int64
	b.db.Pool.QueryRow(ctx, `SELECT id FROM operation_events WHERE operation_id = $1 AND branch = 'claimed' AND actor = 'recovery on app-2'`, op.ID).Scan(&takeover)
	var lateWrites int
	b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE operation_id = $1 AND id > $2 AND actor = 'recovery on app-1'`, op.ID, takeover).Scan(&lateWrites)
	if takeover == 0 || lateWrites != 0 {
		t.Fatalf("takeover event %d, writes by A after it: %d", takeover, lateWrites)
	}
	final, _ := b.store.OperationForPolicy(ctx, pid)
	if final.Status != policies.OpSucceeded || b.effects(t, pid) != 1 {
		t.Fatalf("%s, effects %d", final.Status, b.effects(t, pid))
	}
	checkInvariants(t, b.db)
}

// An admin's decision is conditional on what they saw: of two admins
// resolving the same operation, one wins and the other learns that someone
// else already did.
func TestResolvingIsConditionalOnTheStateSeen(t *testing.T) {
	t.Parallel()
	for _, res := range []policies.Resolution{policies.ResolveCancelled, policies.ResolveRetry, policies.ResolveFailed} {
		t.Run(string(res), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			pid := b.policyIDs[0]
			b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
			b.cancelCrashingAt(t, pid, "none")
			b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
			no := false
			b.settle(t, b.loop(t, "app-2", recovery.Config{MaxPolls: 1, RetryUnknown: &no}))
			seen, _ := b.store.OperationForPolicy(ctx, pid)

			req := policies.ResolveRequest{OperationID: seen.ID, Resolution: res, SeenUpdatedAt: seen.UpdatedAt, Actor: "admin"}
			var wins, lost int
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := b.canceller.Resolve(ctx, req, workflow.Hooks[policies.Operation]{})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						wins++
					case errors.Is(err, policies.ErrStateChanged):
						lost++
					default:
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if wins != 1 || lost != 1 {
				t.Fatalf("wins %d, lost %d", wins, lost)
			}
			op, _ := b.store.OperationForPolicy(ctx, pid)
			want := map[policies.Resolution]string{
				policies.ResolveCancelled: policies.OpSucceeded,
				policies.ResolveRetry:     policies.OpInProgress,
				policies.ResolveFailed:    policies.OpFailed,
			}[res]
			if op.Status != want {
				t.Fatalf("status %s, want %s", op.Status, want)
			}
			if res == policies.ResolveRetry {
				// Back in recovery's hands, which asks first: with the status
				// query healthy again it learns COMPLETED and finishes.
				b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false})
				b.settle(t, b.loop(t, "app-1", recovery.Config{}))
				op, _ = b.store.OperationForPolicy(ctx, pid)
				if op.Status != policies.OpSucceeded {
					t.Fatalf("after retry: %s", op.Status)
				}
			}
			if b.effects(t, pid) != 1 {
				t.Fatalf("effects %d", b.effects(t, pid))
			}
			if got := b.branches(t, op.ID); !contains(got, policies.BranchResolved) {
				t.Fatalf("branches %v", got)
			}
		})
	}
}

// testLog sends a loop's errors to the test log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
