package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/payments"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/reconciliation"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/web/readmodel"
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
	payments  *paymentsfake.Payments
	url       string
	payURL    string
	timeout   time.Duration // the loops' provider timeout: patient, so a loaded test machine does not divert a case into backoff
	engine    *workflow.Engine
	crashes   *crash.Switch // the requests' crash switch
	canceller *policies.Canceller
	alice     int64
	policyIDs []int64
}

func setup(t testing.TB) *bundle {
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
	b.payments = paymentsfake.New(db.Pool, paymentsfake.Options{Logger: quiet})
	paySrv := httptest.NewServer(b.payments.Handler())
	t.Cleanup(func() { b.payments.Close(); paySrv.Close() })
	b.payURL = paySrv.URL
	b.crashes = crash.New(policies.CrashPoints, quiet)
	b.engine = workflow.NewEngine(db.Pool, workflow.Config{Lease: 30 * time.Second, Crash: b.crashes})
	b.canceller = policies.NewCanceller(b.engine, b.client(t), b.payClient(t, b.timeout))
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

func (b *bundle) payClient(t testing.TB, timeout time.Duration) *payments.HTTPClient {
	c := payments.NewHTTPClient(b.payURL, timeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// patientRequests gives the requests a provider client that waits as long
// as the loops' (b.timeout) and a payments client that waits payTimeout.
// The 300 ms default is for modes that never answer; on a loaded machine
// an answered call can take longer, and a request that timed out hands its
// cancellation to recovery before the crash point a case is about.
func (b *bundle) patientRequests(t testing.TB, payTimeout time.Duration) {
	t.Helper()
	b.engine = workflow.NewEngine(b.db.Pool, workflow.Config{Lease: 30 * time.Second, Crash: b.crashes})
	patient := provider.NewHTTPClient(b.url, b.timeout)
	t.Cleanup(patient.CloseIdleConnections)
	b.canceller = policies.NewCanceller(b.engine, patient, b.payClient(t, payTimeout))
}

func (b *bundle) client(t testing.TB) *provider.HTTPClient {
	c := provider.NewHTTPClient(b.url, providerTimeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// worker is one recovery loop and its engine, as another process has them.
type worker struct {
	*recovery.Loop
	engine *workflow.Engine
}

// loop returns a recovery loop over b's database, as instance name, with
// the test's settings (tune changes the defaults). Each loop gets its own
// pool, provider client and engine, as a separate process would.
func (b *bundle) loop(t *testing.T, name string, tune func(*recovery.Config)) worker {
	t.Helper()
	pool, err := database.Open(context.Background(), b.db.URL, 4) // frugal: the server allows 100 connections for every test running
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := provider.NewHTTPClient(b.url, b.timeout)
	t.Cleanup(client.CloseIdleConnections)
	engine := workflow.NewEngine(pool, workflow.Config{Lease: 30 * time.Second, Logger: quiet})
	policies.NewCanceller(engine, client, b.payClient(t, b.timeout))
	cfg := recovery.DefaultConfig()
	cfg.Instance = name
	cfg.Logger = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg.Lease, cfg.PollInterval, cfg.Backoff, cfg.ClockSkew = 2*time.Second, 100*time.Millisecond, 50*time.Millisecond, 100*time.Millisecond
	if tune != nil {
		tune(&cfg)
	}
	l := recovery.New(engine, cfg)
	l.Register(policies.OperationCancel, engine)
	return worker{Loop: l, engine: engine}
}

// believe sets what the app believes about the provider's idempotency.
func (b *bundle) believe(t *testing.T, idempotent bool) {
	t.Helper()
	if _, err := workflow.SetBelief(context.Background(), b.db.Pool, "provider", idempotent, "the test"); err != nil {
		t.Fatal(err)
	}
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

// none is "no crash point": the request runs to its end.
const none crash.Point = "none"

// cancelCrashingAt runs a real cancellation that dies at point if it gets
// there (none: it runs to the end), and returns the operation as the
// database has it — ErrNotFound when nothing of it committed.
func (b *bundle) cancelCrashingAt(t *testing.T, policyID int64, point crash.Point) (workflow.Operation, error) {
	t.Helper()
	ctx := context.Background()
	at := point
	if at == none {
		at = ""
	}
	if err := b.crashes.Arm(crash.Setting{At: at, Mode: crash.Abandon, Once: true}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != nil && r != http.ErrAbortHandler {
				panic(r)
			}
		}()
		_, err := b.canceller.Cancel(ctx, policies.CancelRequest{
			UserID: b.alice, PolicyID: policyID, RequestKey: "key-" + string(point), Actor: "request on app-1",
		}, workflow.Hooks[workflow.Operation]{})
		if err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}()
	b.crashes.Arm(crash.Setting{})
	return b.engine.OperationOf(ctx, policies.OperationCancel, policyID)
}

func (b *bundle) operation(t *testing.T, policyID int64) workflow.Operation {
	t.Helper()
	op, err := b.engine.OperationOf(context.Background(), policies.OperationCancel, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// settle runs passes of l until every operation is terminal.
func (b *bundle) settle(t *testing.T, l worker) recovery.Counts {
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

func (b *bundle) live(t testing.TB) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&n); err != nil {
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
	a.Reasked += c.Reasked
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

// refunds counts the refunds the payments service made for policyID.
func (b *bundle) refunds(t *testing.T, policyID int64) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM fake_payments.ledger WHERE kind = 'refund' AND policy_id = $1`, policyID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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
// (docs/cancellation.md) with at most one provider effect — exactly one
// when it succeeded.
func TestEveryModeAndCrashPointEndsInItsDocumentedState(t *testing.T) {
	t.Parallel()
	type want struct {
		status  string
		effects int
		branch  string // the branch recovery took; "" = nothing to recover
	}
	var (
		succeeded     = want{workflow.StatusSucceeded, 1, ""}
		failed        = want{workflow.StatusFailed, 0, ""}
		afterRetry    = want{workflow.StatusSucceeded, 1, workflow.BranchNotStarted}
		afterAsking   = want{workflow.StatusSucceeded, 1, workflow.BranchCompleted}
		refusedAsking = want{workflow.StatusFailed, 0, workflow.BranchRejected}
	)
	// atTheEnd is how a request that ran to its end leaves each mode.
	atTheEnd := map[fake.Mode]want{
		fake.ModeOK: succeeded, fake.ModeReject: failed, fake.ModeError: afterRetry, fake.ModeDrop: afterRetry,
		fake.ModeLostResponse: afterAsking, fake.ModeSlow: afterAsking,
	}
	// afterTheCall is how recovery finds each mode when the request died
	// after calling, before recording: it asks, and acts on the truth.
	afterTheCall := map[fake.Mode]want{
		fake.ModeOK: afterAsking, fake.ModeReject: refusedAsking, fake.ModeError: afterRetry, fake.ModeDrop: afterRetry,
		fake.ModeLostResponse: afterAsking, fake.ModeSlow: afterAsking,
	}
	expect := func(mode fake.Mode, point crash.Point) (want, bool) {
		switch point {
		case "after_record_intent":
			return want{}, false // nothing committed: no operation; the client's retry runs afresh
		case "before_provider_cancel":
			return afterRetry, true // the call was never made, whatever the mode would have done
		case "after_provider_cancel":
			return afterTheCall[mode], true
		case "after_mark_cancelled", "after_publish_event":
			if mode == fake.ModeOK { // reached only once the provider confirmed; the transaction rolled back
				return afterAsking, true
			}
		case "before_refund":
			if mode == fake.ModeOK { // the policy is cancelled; the refund never sent
				return afterRetry, true
			}
		case "after_refund", "after_audit":
			if mode == fake.ModeOK { // the refund made, its outcome (and audit) rolled back or never recorded
				return afterAsking, true
			}
		}
		return atTheEnd[mode], true // none, after_commit, and the points a mode never reaches
	}
	for _, mode := range []fake.Mode{fake.ModeOK, fake.ModeReject, fake.ModeError, fake.ModeDrop, fake.ModeLostResponse, fake.ModeSlow} {
		for _, point := range append([]crash.Point{none}, canonical(policies.CrashPoints)...) {
			t.Run(fmt.Sprintf("%s/%s", mode, point), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pid := b.policyIDs[0]
				if mode == fake.ModeOK || mode == fake.ModeReject {
					// A definite answer is waited for. (An error answer's
					// step keeps the short deadline: recovery's wait for it
					// to pass is part of what the case shows.)
					b.patientRequests(t, b.timeout)
				}
				b.setFaults(t, faults{mode: mode, idempotent: true})
				before, err := b.cancelCrashingAt(t, pid, point)
				w, exists := expect(mode, point)
				if !exists {
					if !errors.Is(err, workflow.ErrNotFound) {
						t.Fatalf("crashed before the first commit, yet: %+v %v", before, err)
					}
					// The client retries with the same key: it runs afresh.
					b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true})
					op, err := b.canceller.Cancel(context.Background(), policies.CancelRequest{UserID: b.alice, PolicyID: pid,
						RequestKey: "key-" + string(point), Actor: "the retry"}, workflow.Hooks[workflow.Operation]{})
					if err != nil || op.Status != workflow.StatusSucceeded || b.effects(t, pid) != 1 {
						t.Fatalf("retry: %+v %v, effects %d", op, err, b.effects(t, pid))
					}
					checkInvariants(t, b.db)
					return
				}
				if err != nil {
					t.Fatal(err)
				}

				b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true}) // faults off
				l := b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls = 6 })
				// A crashed request's 30s lease has not run out yet: recovery
				// leaves the operation alone until it does…
				// (a handed-over one is claimed at once).
				first, err := l.RunOnce(context.Background())
				if err != nil || (before.LeaseExpiresAt.After(time.Now().Add(time.Second)) && first.Claimed != 0) {
					t.Fatalf("first pass claimed %+v (%v) an operation whose lease was running", first, err)
				}
				// …then takes it over (time moved past the lease, not slept).
				l.engine.Clock().Set(time.Now().Add(31 * time.Second))
				counts := add(first, b.settle(t, l))

				op := b.operation(t, pid)
				if op.Status != w.status {
					t.Errorf("status %s, want %s (last error %v)", op.Status, w.status, deref(op.LastError))
				}
				if got := b.effects(t, pid); got != w.effects {
					t.Errorf("provider effects %d, want %d", got, w.effects)
				}
				if got, want := b.refunds(t, pid), w.effects; got != want { // a refund exactly when cancelled
					t.Errorf("refunds %d, want %d", got, want)
				}
				branches := b.branches(t, op.ID)
				if w.branch == "" && counts.Claimed != 0 {
					t.Errorf("recovery claimed a finished operation: %+v, branches %v", counts, branches)
				}
				if w.branch != "" && (counts.Claimed != 1 || !contains(branches, w.branch)) {
					t.Errorf("claims %d, branches %v; want one claim and branch %s", counts.Claimed, branches, w.branch)
				}
				if op.Status == workflow.StatusSucceeded {
					for _, s := range op.Steps {
						if s.State != workflow.StepDone {
							t.Errorf("SUCCEEDED with step %s %s", s.Name, s.State)
						}
					}
				}
				checkInvariants(t, b.db)
			})
		}
	}
}

// canonical drops the older alias names from a list of crash points.
func canonical(points []crash.Point) []crash.Point {
	var out []crash.Point
	for _, p := range points {
		if p != "after_claim" && p != "after_provider_call" {
			out = append(out, p)
		}
	}
	return out
}

// branches lists the recovery branches on an operation's timeline.
func (b *bundle) branches(t *testing.T, opID int64) []string {
	t.Helper()
	events, err := readmodel.Timeline(context.Background(), b.db.Pool, opID)
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
// be asked: recovery must not call again (that could cancel twice). It
// backs off and asks again (issue 11: a person is the last resort), and
// only once its attempts are used — right after a last status query that
// still cannot be answered — does the operation go to reconciliation. The
// effect count stays 1.
func TestNotIdempotentLostResponseGoesToReconciliation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
	op, _ := b.cancelCrashingAt(t, pid, none)
	if op.Status != workflow.StatusInProgress {
		t.Fatalf("after a lost response: %s", op.Status)
	}
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
	b.believe(t, false)
	l := b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 2, 3 })
	c := b.settle(t, l)
	op = b.operation(t, pid)
	if op.Status != workflow.StatusNeedsReconciliation || c.Reconcile != 1 || c.BackedOff != 2 {
		t.Fatalf("status %s, counts %+v; want NEEDS_RECONCILIATION after two backoffs", op.Status, c)
	}
	if got := b.effects(t, pid); got != 1 {
		t.Fatalf("effects %d, want 1", got)
	}
	if op.LastError == nil || !strings.Contains(*op.LastError, "last status query") {
		t.Errorf("evidence missing: last_error %v", deref(op.LastError))
	}
	calls, _ := readmodel.Calls(context.Background(), b.db.Pool, op.ID)
	var sends, asks int
	for _, cr := range calls {
		switch cr.Kind {
		case "call":
			sends++
		case "status":
			asks++
		}
	}
	if sends != 1 || asks < 3 {
		t.Errorf("calls %d (want only the request's), status queries %d", sends, asks)
	}
	// The belief in force is on the timeline.
	events, _ := readmodel.Timeline(context.Background(), b.db.Pool, op.ID)
	named := false
	for _, e := range events {
		named = named || strings.Contains(e.Detail, "believes provider calls are NOT idempotent")
	}
	if !named {
		t.Error("no timeline event names the belief that decided")
	}
	// It is asked again later, not before.
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("a NEEDS_RECONCILIATION operation was asked again at once: %+v", c)
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
	b.cancelCrashingAt(t, pid, none)
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false})
	b.believe(t, false)
	b.settle(t, b.loop(t, "app-2", nil))
	op := b.operation(t, pid)
	if op.Status != workflow.StatusSucceeded || b.effects(t, pid) != 1 {
		t.Fatalf("status %s, effects %d", op.Status, b.effects(t, pid))
	}
	checkInvariants(t, b.db)
}

// A provider that cannot be reached at all: each attempt backs off (the
// operation stays RECOVERING with a next attempt time), and once the
// attempts are used it goes to reconciliation with the evidence.
func TestUnreachableProviderBacksOffThenReconciles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeDrop, idempotent: true, statusMode: fake.StatusError})
	b.cancelCrashingAt(t, pid, none) // attempt 1: the request's own, handed over
	l := b.loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.Backoff, c.MaxBackoff = 1, 3, time.Hour, 2*time.Hour
	})

	c, err := l.RunOnce(context.Background())
	if err != nil || c.BackedOff != 1 {
		t.Fatalf("first pass %+v %v; want a backoff", c, err)
	}
	op := b.operation(t, pid)
	if op.Status != workflow.StatusRecovering || op.Attempts != 2 || op.NextAttemptAt == nil || time.Until(*op.NextAttemptAt) < 30*time.Minute {
		t.Fatalf("after a backoff: %s attempts %d next %v", op.Status, op.Attempts, op.NextAttemptAt)
	}
	if c, _ := l.RunOnce(context.Background()); c.Claimed != 0 {
		t.Fatalf("claimed during its backoff: %+v", c)
	}
	l.engine.Clock().Set(time.Now().Add(3 * time.Hour))
	if c, err = l.RunOnce(context.Background()); err != nil || c.BackedOff != 1 {
		t.Fatalf("second attempt %+v %v; want another backoff", c, err)
	}
	l.engine.Clock().Set(time.Now().Add(6 * time.Hour))
	if c, err = l.RunOnce(context.Background()); err != nil || c.Reconcile != 1 {
		t.Fatalf("third attempt %+v %v; want reconciliation", c, err)
	}
	op = b.operation(t, pid)
	if op.Status != workflow.StatusNeedsReconciliation || op.Attempts != 3 || op.NextAttemptAt == nil {
		t.Fatalf("%s attempts %d, next question %v", op.Status, op.Attempts, op.NextAttemptAt)
	}
	if got := b.branches(t, op.ID); !contains(got, workflow.BranchBackoff) || got[len(got)-1] != workflow.BranchReconciliation {
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
				    INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
				    SELECT $1, 'POL-LOAD-' || i, 'Load Test', 10, current_date - 30, current_date + 335
				      FROM generate_series(1, $2) i
				    RETURNING id, user_id),
				o AS (
				    INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
				                            owner_token, owner_id, lease_expires_at)
				    SELECT id, 'CANCEL', user_id, 'k-' || id, 'IN_PROGRESS',
				           gen_random_uuid(), 'request on a dead instance', now() - interval '1 second'
				      FROM p
				    RETURNING id)
				-- their steps: the intent recorded, nothing sent yet
				INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, finished_at)
				SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system,
				       CASE WHEN s.position = 1 THEN 'DONE' ELSE 'PENDING' END,
				       CASE WHEN s.position = 1 THEN now() END
				  FROM o,
				       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
				               (4, 'publish_event', NULL), (5, 'audit', NULL)) AS s(position, name, system)`, b.alice, n)
			if err != nil {
				t.Fatal(err)
			}
			loops := []worker{}
			for i := range 3 {
				loops = append(loops, b.loop(t, fmt.Sprintf("app-%d", i+1), func(c *recovery.Config) { c.Strategy, c.BatchSize = strategy, 25 }))
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
			b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status = 'SUCCEEDED'`).Scan(&succeeded)
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
	op, _ := b.cancelCrashingAt(t, pid, none) // RUNNING at the provider for 2s; handed over
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true})

	// A waits long between polls, so B takes over inside A's first wait
	// however slow the machine is; B polls briskly until the provider
	// completes. When A wakes up, the operation is no longer its own.
	a := b.loop(t, "app-1", func(c *recovery.Config) { c.Lease, c.MaxPolls, c.PollInterval = time.Second, 10, 3*time.Second })
	bb := b.loop(t, "app-2", func(c *recovery.Config) { c.Lease, c.MaxPolls, c.PollInterval = time.Second, 10, 150*time.Millisecond })
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
	bb.engine.Clock().Set(time.Now().Add(time.Hour))
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
	// After the takeover, A's only line on the timeline is its refusal.
	var lateWrites, refusals int
	b.db.Pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE branch IS DISTINCT FROM 'fenced'), count(*) FILTER (WHERE branch = 'fenced')
		  FROM operation_events
		 WHERE operation_id = $1 AND id > $2 AND actor = 'recovery on app-1'`, op.ID, takeover).Scan(&lateWrites, &refusals)
	if takeover == 0 || lateWrites != 0 || refusals != 1 {
		t.Fatalf("takeover event %d, writes by A after it: %d, refusals recorded: %d", takeover, lateWrites, refusals)
	}
	final := b.operation(t, pid)
	if final.Status != workflow.StatusSucceeded || b.effects(t, pid) != 1 {
		t.Fatalf("%s, effects %d", final.Status, b.effects(t, pid))
	}
	checkInvariants(t, b.db)
}

// An admin's decision is conditional on what they saw: of two admins
// resolving the same operation, one wins and the other learns that someone
// else already did.
func TestResolvingIsConditionalOnTheStateSeen(t *testing.T) {
	t.Parallel()
	for _, res := range []workflow.Resolution{workflow.ResolveDone, workflow.ResolveRetry, workflow.ResolveFailed} {
		t.Run(string(res), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			pid := b.policyIDs[0]
			b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
			b.cancelCrashingAt(t, pid, none)
			b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
			b.believe(t, false)
			b.settle(t, b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 1, 1 }))
			seen := b.operation(t, pid)
			if seen.Status != workflow.StatusNeedsReconciliation {
				t.Fatalf("not in reconciliation: %s", seen.Status)
			}

			req := reconciliation.ResolveRequest{OperationID: seen.ID, Resolution: res, SeenUpdatedAt: seen.UpdatedAt, Actor: "admin"}
			var wins, lost int
			var wg sync.WaitGroup
			var mu sync.Mutex
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := reconciliation.New(b.db.Pool, b.engine).Resolve(ctx, req, workflow.Hooks[workflow.Operation]{})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						wins++
					case errors.Is(err, workflow.ErrStateChanged):
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
			op := b.operation(t, pid)
			want := map[workflow.Resolution]string{
				workflow.ResolveDone:   workflow.StatusInProgress, // the policy cancelled; the refund is recovery's
				workflow.ResolveRetry:  workflow.StatusInProgress,
				workflow.ResolveFailed: workflow.StatusFailed,
			}[res]
			if op.Status != want {
				t.Fatalf("status %s, want %s", op.Status, want)
			}
			if res == workflow.ResolveDone {
				if b.refunds(t, pid) != 0 {
					t.Fatal("the person's decision refunded: that is a call, recovery's to make")
				}
				b.settle(t, b.loop(t, "app-1", nil))
				if op = b.operation(t, pid); op.Status != workflow.StatusSucceeded || b.refunds(t, pid) != 1 {
					t.Fatalf("after the decision: %s, refunds %d", op.Status, b.refunds(t, pid))
				}
			}
			if res == workflow.ResolveRetry {
				// Back in recovery's hands, which asks first: with the status
				// query healthy again it learns COMPLETED and finishes.
				b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false})
				b.settle(t, b.loop(t, "app-1", nil))
				if op = b.operation(t, pid); op.Status != workflow.StatusSucceeded {
					t.Fatalf("after retry: %s", op.Status)
				}
			}
			if b.effects(t, pid) != 1 {
				t.Fatalf("effects %d", b.effects(t, pid))
			}
			if got := b.branches(t, op.ID); !contains(got, workflow.BranchResolved) {
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

// A person is the last resort (issue 11, item 4): an operation waiting for
// one is asked again when due. While its truth stays unknown nothing a
// person is looking at changes (status and updated_at stay; the question is
// in operation_calls); once the truth is known, recovery takes it back and
// finishes it — and a person's decision made first would stand instead.
func TestAnOperationWaitingForAPersonIsAskedAgainAndFinished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
	b.cancelCrashingAt(t, pid, none)
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
	b.believe(t, false)
	l := b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts, c.ReaskInterval = 1, 1, time.Minute })
	b.settle(t, l)
	waiting := b.operation(t, pid)
	if waiting.Status != workflow.StatusNeedsReconciliation || waiting.NextAttemptAt == nil {
		t.Fatalf("not waiting for a person with a next question: %+v", waiting)
	}
	// Not due yet: nothing asked.
	if c, _ := l.RunOnce(ctx); c.Claimed != 0 {
		t.Fatalf("asked before it was due: %+v", c)
	}
	asked := func() int {
		var n int
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_calls WHERE operation_id = $1 AND kind = 'status'`, waiting.ID).Scan(&n)
		return n
	}
	before := asked()

	// Due, the provider still cannot be asked: it keeps waiting, untouched.
	l.engine.Clock().Set(time.Now().Add(2 * time.Minute))
	c, err := l.RunOnce(ctx)
	if err != nil || c.Reasked != 1 {
		t.Fatalf("re-ask pass %+v %v", c, err)
	}
	still := b.operation(t, pid)
	if still.Status != workflow.StatusNeedsReconciliation || !still.UpdatedAt.Equal(waiting.UpdatedAt) || asked() != before+1 {
		t.Fatalf("after an unanswered question: %s, updated_at %s (was %s), questions %d (was %d)",
			still.Status, still.UpdatedAt, waiting.UpdatedAt, asked(), before)
	}
	if !still.NextAttemptAt.After(*waiting.NextAttemptAt) {
		t.Errorf("next question %s, not after %s", still.NextAttemptAt, waiting.NextAttemptAt)
	}

	// The provider answers again: COMPLETED. Recovery finishes it: the
	// refund, the audit, SUCCEEDED — one cancellation, one refund.
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false})
	l.engine.Clock().Set(time.Now().Add(time.Hour))
	if c, err = l.RunOnce(ctx); err != nil || c.Succeeded != 1 {
		t.Fatalf("second re-ask %+v %v", c, err)
	}
	done := b.operation(t, pid)
	if done.Status != workflow.StatusSucceeded || b.effects(t, pid) != 1 || b.refunds(t, pid) != 1 {
		t.Fatalf("after the truth came back: %s, effects %d, refunds %d", done.Status, b.effects(t, pid), b.refunds(t, pid))
	}
	if got := b.branches(t, done.ID); !contains(got, workflow.BranchReasked) {
		t.Fatalf("branches %v", got)
	}
	checkInvariants(t, b.db)
}

// The questions to an operation waiting for a person come at the re-ask
// interval, doubling from when it began to wait — not from its attempts: a
// chaos run's operations that came to a person after 9 attempts (of 5)
// were asked once after 30 s and then only after 5 minutes, and the drain
// found them still waiting with their truth long known.
func TestReaskingCountsFromWhenTheWaitBegan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pid := b.policyIDs[0]
	b.setFaults(t, faults{mode: fake.ModeLostResponse, idempotent: false})
	b.cancelCrashingAt(t, pid, none)
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: false, statusMode: fake.StatusError})
	b.believe(t, false)
	l := b.loop(t, "app-2", func(c *recovery.Config) {
		c.MaxPolls, c.MaxAttempts, c.ReaskInterval, c.MaxBackoff = 1, 1, time.Minute, time.Hour
	})
	b.settle(t, l)
	waiting := b.operation(t, pid)
	if waiting.Status != workflow.StatusNeedsReconciliation || waiting.NextAttemptAt == nil {
		t.Fatalf("not waiting for a person with a next question: %+v", waiting)
	}
	// It came to a person after many attempts, as in the chaos run.
	if _, err := b.db.Pool.Exec(ctx, `UPDATE operations SET attempts = 9 WHERE id = $1`, waiting.ID); err != nil {
		t.Fatal(err)
	}

	// Due; the provider still cannot be asked: the next question comes one
	// interval later (it has waited less than one), not 2^8 intervals.
	l.engine.Clock().Set(time.Now().Add(2 * time.Minute))
	asked := time.Now()
	if c, err := l.RunOnce(ctx); err != nil || c.Reasked != 1 {
		t.Fatalf("re-ask pass %+v %v", c, err)
	}
	still := b.operation(t, pid)
	if still.Status != workflow.StatusNeedsReconciliation || still.NextAttemptAt == nil {
		t.Fatalf("after an unanswered question: %+v", still)
	}
	if next := still.NextAttemptAt.Sub(asked); next > 2*time.Minute {
		t.Fatalf("next question %s after the first; want about the re-ask interval (1m): it has waited only seconds", next.Round(time.Second))
	}

	// Waiting since 20 minutes: the next question 20 minutes on (doubling).
	if _, err := b.db.Pool.Exec(ctx, `UPDATE operations SET updated_at = now() - interval '20 minutes', next_attempt_at = now() WHERE id = $1`, waiting.ID); err != nil {
		t.Fatal(err)
	}
	asked = time.Now()
	if c, err := l.RunOnce(ctx); err != nil || c.Reasked != 1 {
		t.Fatalf("second re-ask pass %+v %v", c, err)
	}
	still = b.operation(t, pid)
	if next := still.NextAttemptAt.Sub(asked); next < 19*time.Minute || next > 22*time.Minute {
		t.Fatalf("after 20 minutes of waiting the next question comes %s later; want about 20m", next.Round(time.Second))
	}
}

// One last status query precedes every hand-over to a person: the event
// that sends the operation to reconciliation is preceded, in the log of
// calls, by a status query made by the same worker after its last call.
// And with a provider that cannot be asked and is not believed idempotent,
// recovery backs off and asks again before a person is involved.
func TestEveryHandOverToAPersonFollowsAStatusQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		idempotent bool
	}{{"not idempotent: back off, ask again", false}, {"idempotent: the same call, then ask", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			pid := b.policyIDs[0]
			b.setFaults(t, faults{mode: fake.ModeDrop, idempotent: tc.idempotent, statusMode: fake.StatusError})
			b.believe(t, tc.idempotent)
			b.cancelCrashingAt(t, pid, none)
			l := b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls, c.MaxAttempts = 1, 3 })
			counts := b.settle(t, l)
			op := b.operation(t, pid)
			if op.Status != workflow.StatusNeedsReconciliation {
				t.Fatalf("status %s", op.Status)
			}
			if counts.BackedOff < 1 {
				t.Errorf("went to a person without backing off first: %+v", counts)
			}
			var lastKind string
			var lastAt, reconciledAt time.Time
			b.db.Pool.QueryRow(ctx, `SELECT at FROM operation_events WHERE operation_id = $1 AND branch = 'reconciliation'`, op.ID).Scan(&reconciledAt)
			b.db.Pool.QueryRow(ctx, `
				SELECT kind, at FROM operation_calls WHERE operation_id = $1 AND kind IN ('call', 'status') ORDER BY id DESC LIMIT 1`,
				op.ID).Scan(&lastKind, &lastAt)
			if lastKind != "status" || lastAt.After(reconciledAt) {
				t.Fatalf("the last exchange before the hand-over was a %s at %s (hand-over at %s)", lastKind, lastAt, reconciledAt)
			}
			if n := b.effects(t, pid); n != 0 {
				t.Fatalf("effects %d", n)
			}
		})
	}
}

// A pass does not wait for its slowest claim (issue 11, item 5): while one
// operation is being polled (its provider says RUNNING for seconds), an
// operation handed over meanwhile is claimed by the next pass — before the
// slow one is finished.
func TestAHandedOverOperationIsNotHeldBackByASlowClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	slow, quick := b.policyIDs[0], b.policyIDs[1]
	f := fake.DefaultFault()
	f.Mode, f.SlowMS = fake.ModeSlow, 4000
	if _, err := b.fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	slowOp, _ := b.cancelCrashingAt(t, slow, none) // RUNNING at the provider for 4 s, handed over
	l := b.loop(t, "app-2", func(c *recovery.Config) {
		c.Interval, c.MaxPolls, c.PollInterval = 100*time.Millisecond, 10, 500*time.Millisecond
	})
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	waitFor(t, 5*time.Second, func() bool { return contains(b.branches(t, slowOp.ID), workflow.BranchPoll) })

	// Now a second cancellation meets a dropped call and is handed over.
	f.Mode = fake.ModeDrop
	if _, err := b.fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	quickOp, _ := b.cancelCrashingAt(t, quick, none)
	b.setFaults(t, faults{mode: fake.ModeOK, idempotent: true})
	waitFor(t, 5*time.Second, func() bool { return contains(b.branches(t, quickOp.ID), workflow.BranchClaimed) })
	if op := b.operation(t, slow); op.Terminal() {
		t.Fatalf("the slow claim finished first (%s): this proves nothing", op.Status)
	}
	waitFor(t, 20*time.Second, func() bool { return b.live(t) == 0 })
	stop()
	<-done
	if b.operation(t, slow).Status != workflow.StatusSucceeded || b.operation(t, quick).Status != workflow.StatusSucceeded {
		t.Fatal("not both finished")
	}
	checkInvariants(t, b.db)
}

// A loop whose every place is taken claims again as soon as a recovery
// frees one, not at its next tick: with a tick of an hour and one place,
// three stale operations drain only if each finished recovery wakes the
// loop. (It used to wait the whole Interval, which capped a drain at
// RECOVERY_BATCH operations a second per loop: 10,000 took minutes.)
func TestALoopWithEveryPlaceTakenClaimsAgainWhenOneFrees(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedStale(t, b, 3)
	l := b.loop(t, "app-2", func(c *recovery.Config) { c.Interval, c.BatchSize = time.Hour, 1 })
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	waitFor(t, 20*time.Second, func() bool { return b.live(t) == 0 })
	stop()
	<-done
	checkInvariants(t, b.db)
}

// An operation is claimable from when both its lease and its backoff are
// over: the lag is measured from the longest claimable, the claim takes
// the longest claimable first, and one still backing off is neither —
// however long ago its lease ran out. (Ordered by the lease, the claim took
// the operation whose lease ran out first, though it had become claimable
// only lately, and the lag read every live row.)
func TestTheClaimAndTheLagGoByWhenAnOperationBecameClaimable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seedStale(t, b, 3)
	now := time.Now().Truncate(time.Second)
	var ids []int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM operations`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	set := func(id int64, lease, next time.Duration, hasNext bool) {
		t.Helper()
		var at *time.Time
		if hasNext {
			v := now.Add(next)
			at = &v
		}
		if _, err := b.db.Pool.Exec(ctx, `UPDATE operations SET lease_expires_at = $2, next_attempt_at = $3 WHERE id = $1`,
			id, now.Add(lease), at); err != nil {
			t.Fatal(err)
		}
	}
	set(ids[0], -10*time.Minute, -30*time.Second, true) // lease over long ago, backoff over 30 s ago
	set(ids[1], -time.Minute, 0, false)                 // lease over a minute ago, no backoff
	set(ids[2], -20*time.Minute, time.Minute, true)     // still backing off
	b.engine.Clock().Set(now)

	age, err := b.engine.StaleAge(ctx)
	if err != nil || age != time.Minute {
		t.Fatalf("lag %s (%v), want 1m0s: claimable a minute ago, the backed-off one not at all", age, err)
	}
	claims, err := b.engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.SkipLocked, Actor: "the test", Lease: time.Minute, Limit: 1})
	if err != nil || len(claims) != 1 || claims[0].ID != ids[1] {
		t.Fatalf("first claim %v (%v), want operation %d, claimable longest", claimedIDs(claims), err, ids[1])
	}
	claims, err = b.engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.Transition, Actor: "the test", Lease: time.Minute, Limit: 5})
	if err != nil || len(claims) != 1 || claims[0].ID != ids[0] {
		t.Fatalf("next claims %v (%v), want only operation %d: %d is backing off", claimedIDs(claims), err, ids[0], ids[2])
	}
}

func claimedIDs(claims []recovery.Claim) []int64 {
	ids := make([]int64, len(claims))
	for i, c := range claims {
		ids[i] = c.ID
	}
	return ids
}

// Two recovery loops racing on the same stale workflows: each operation is
// claimed by one of them, and every call of each of its steps is made by
// that one owner (the calls' owner tokens), never by both.
func TestTwoLoopsRacingOnOneWorkflowEachStepCalledByOneOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.timeout = 10 * time.Second // patient: a timeout here would add a legitimate second attempt
	for _, pid := range b.policyIDs {
		if _, err := b.cancelCrashingAt(t, pid, "before_provider_cancel"); err != nil {
			t.Fatal(err)
		}
	}
	// Their owner died: the lease ran out.
	if _, err := b.db.Pool.Exec(ctx, `UPDATE operations SET lease_expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	loops := []worker{
		b.loop(t, "app-1", func(c *recovery.Config) { c.BatchSize, c.ClockSkew = 1, 0 }),
		b.loop(t, "app-2", func(c *recovery.Config) { c.BatchSize, c.ClockSkew = 1, 0 }),
	}
	// The first calls' deadlines (the dead request's) must pass first.
	time.Sleep(providerTimeout)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 40 {
				if _, err := l.RunOnce(ctx); err != nil {
					t.Error(err)
					return
				}
				if b.live(t) == 0 {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	var owners, claims, actors int
	b.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM (
		    SELECT c.step_key
		      FROM operation_calls c
		     WHERE c.kind = 'call' AND c.actor LIKE 'recovery on %'
		     GROUP BY c.step_key
		    HAVING count(DISTINCT c.owner_token) > 1) x`).Scan(&owners)
	b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE branch = 'claimed'`).Scan(&claims)
	b.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT actor) FROM operation_events WHERE branch = 'claimed'`).Scan(&actors)
	if owners != 0 || claims != len(b.policyIDs) {
		t.Fatalf("%d steps called by more than one owner; %d claims for %d operations", owners, claims, len(b.policyIDs))
	}
	t.Logf("%d operations claimed by %d loops", claims, actors)
	for _, pid := range b.policyIDs {
		if op := b.operation(t, pid); op.Status != workflow.StatusSucceeded || b.effects(t, pid) != 1 || b.refunds(t, pid) != 1 {
			t.Fatalf("policy %d: %s, effects %d, refunds %d", pid, op.Status, b.effects(t, pid), b.refunds(t, pid))
		}
	}
	checkInvariants(t, b.db)
}

// Every payments mode × every crash point around the refund (the provider
// healthy): after recovery with the faults off, the operation is in its
// documented state with at most one refund — exactly one where the policy
// is cancelled and the refund was not refused. A refused refund waits for a
// person: the policy stays cancelled, nothing is paid twice.
func TestEveryPaymentsModeAndRefundCrashPointEndsInItsDocumentedState(t *testing.T) {
	t.Parallel()
	type want struct {
		status  string
		refunds int
		branch  string // the branch recovery took; "" = nothing to recover
	}
	var (
		succeeded   = want{workflow.StatusSucceeded, 1, ""}
		refused     = want{workflow.StatusNeedsReconciliation, 0, ""}
		afterRetry  = want{workflow.StatusSucceeded, 1, workflow.BranchNotStarted}
		afterAsking = want{workflow.StatusSucceeded, 1, workflow.BranchCompleted}
		refusedSeen = want{workflow.StatusNeedsReconciliation, 0, workflow.BranchRejected}
	)
	atTheEnd := map[fault.Mode]want{
		fault.ModeOK: succeeded, fault.ModeReject: refused, fault.ModeError: afterRetry, fault.ModeDrop: afterRetry,
		fault.ModeLostResponse: afterAsking, fault.ModeSlow: afterAsking,
	}
	afterTheCall := map[fault.Mode]want{
		fault.ModeOK: afterAsking, fault.ModeReject: refusedSeen, fault.ModeError: afterRetry, fault.ModeDrop: afterRetry,
		fault.ModeLostResponse: afterAsking, fault.ModeSlow: afterAsking,
	}
	expect := func(mode fault.Mode, point crash.Point) want {
		switch point {
		case "before_refund":
			return afterRetry // never sent, whatever the mode would have done
		case "after_refund":
			return afterTheCall[mode]
		case "after_audit":
			if mode == fault.ModeOK { // reached only once payments confirmed; the transaction rolled back
				return afterAsking
			}
		}
		return atTheEnd[mode] // none, after_commit, and a point a mode never reaches
	}
	for _, mode := range []fault.Mode{fault.ModeOK, fault.ModeReject, fault.ModeError, fault.ModeDrop, fault.ModeLostResponse, fault.ModeSlow} {
		for _, point := range []crash.Point{none, "before_refund", "after_refund", "after_audit", "after_commit"} {
			t.Run(fmt.Sprintf("%s/%s", mode, point), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				ctx := context.Background()
				pid := b.policyIDs[0]
				// The request waits 300 ms for payments: modes that never answer
				// cost one short timeout. The provider always answers.
				b.patientRequests(t, providerTimeout)
				pf := fault.Default()
				pf.Mode, pf.SlowMS = mode, 800
				if _, err := b.payments.SetFaults(ctx, pf); err != nil {
					t.Fatal(err)
				}
				before, err := b.cancelCrashingAt(t, pid, point)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := b.payments.SetFaults(ctx, fault.Default()); err != nil { // faults off
					t.Fatal(err)
				}
				w := expect(mode, point)
				l := b.loop(t, "app-2", func(c *recovery.Config) { c.MaxPolls = 6 })
				first, err := l.RunOnce(ctx)
				if err != nil || (before.LeaseExpiresAt.After(time.Now().Add(time.Second)) && first.Claimed != 0) {
					t.Fatalf("first pass claimed %+v (%v) an operation whose lease was running", first, err)
				}
				l.engine.Clock().Set(time.Now().Add(31 * time.Second))
				counts := add(first, b.settle(t, l))

				op := b.operation(t, pid)
				if op.Status != w.status {
					t.Errorf("status %s, want %s (last error %v)", op.Status, w.status, deref(op.LastError))
				}
				if got := b.refunds(t, pid); got != w.refunds {
					t.Errorf("refunds %d, want %d", got, w.refunds)
				}
				if b.effects(t, pid) != 1 || b.policyStatus(t, pid) != policies.StatusCancelled {
					t.Errorf("provider effects %d, policy %s: the cancellation itself must stand", b.effects(t, pid), b.policyStatus(t, pid))
				}
				branches := b.branches(t, op.ID)
				if w.branch == "" && counts.Claimed != 0 {
					t.Errorf("recovery claimed a finished operation: %+v, branches %v", counts, branches)
				}
				if w.branch != "" && !contains(branches, w.branch) {
					t.Errorf("branches %v; want %s", branches, w.branch)
				}
				checkInvariants(t, b.db)
			})
		}
	}
}

func (b *bundle) policyStatus(t *testing.T, policyID int64) string {
	t.Helper()
	p, err := b.store.Get(context.Background(), b.alice, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return p.Status
}
