// Package recoverytest is the world the recovery tests run in: a fresh
// database with the demo accounts, the fake provider and payments service
// over HTTP, a cancellation's engine and canceller with a crash switch, and
// recovery loops as other processes have them. The decision tree's tests
// (internal/workflow), the loop's (internal/recovery) and the desk's
// (internal/reconciliation) share it.
package recoverytest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/invariants"
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

// ProviderTimeout is every client's patience: short so timeouts are cheap,
// long enough that an answered call is not mistaken for one under -race.
const ProviderTimeout = 300 * time.Millisecond

// Quiet is a logger that says nothing.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Bundle is one test's world: its database, fakes, engine and canceller.
type Bundle struct {
	DB        *testdb.DB
	Store     *policies.Store
	Fake      *fake.Provider
	Payments  *paymentsfake.Payments
	URL       string
	PayURL    string
	Timeout   time.Duration // the loops' provider timeout: patient, so a loaded test machine does not divert a case into backoff
	Engine    *workflow.Engine
	Crashes   *crash.Switch // the requests' crash switch
	Canceller *policies.Canceller
	Alice     int64
	PolicyIDs []int64
}

// Setup builds a Bundle over a fresh database with the demo accounts.
func Setup(t testing.TB) *Bundle {
	t.Helper()
	db := testdb.New(t)
	ctx := context.Background()
	if err := demo.Seed(ctx, db.Pool, demo.DefaultAccounts(), time.Now()); err != nil {
		t.Fatal(err)
	}
	b := &Bundle{DB: db, Store: policies.NewStore(db.Pool)}
	b.Fake = fake.New(db.Pool, fake.Options{Logger: Quiet})
	srv := httptest.NewServer(b.Fake.Handler())
	t.Cleanup(func() { b.Fake.Close(); srv.Close() })
	b.URL, b.Timeout = srv.URL, 2*time.Second
	b.Payments = paymentsfake.New(db.Pool, paymentsfake.Options{Logger: Quiet})
	paySrv := httptest.NewServer(b.Payments.Handler())
	t.Cleanup(func() { b.Payments.Close(); paySrv.Close() })
	b.PayURL = paySrv.URL
	b.Crashes = crash.New(policies.CrashPoints, Quiet)
	b.Engine = workflow.NewEngine(db.Pool, workflow.Config{Lease: 30 * time.Second, Crash: b.Crashes})
	b.Canceller = policies.NewCanceller(b.Engine, b.Client(t), b.PayClient(t, b.Timeout), events.NewWriter(b.Crashes))
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM users WHERE name = 'alice'`).Scan(&b.Alice); err != nil {
		t.Fatal(err)
	}
	list, err := b.Store.List(ctx, policies.ListFilter{UserID: b.Alice, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		b.PolicyIDs = append(b.PolicyIDs, p.ID)
	}
	return b
}

// PayClient is a payments client with the given patience.
func (b *Bundle) PayClient(t testing.TB, timeout time.Duration) *payments.HTTPClient {
	c := payments.NewHTTPClient(b.PayURL, timeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// PatientRequests gives the requests a provider client that waits as long
// as the loops' (b.Timeout) and a payments client that waits payTimeout.
// The 300 ms default is for modes that never answer; on a loaded machine
// an answered call can take longer, and a request that timed out hands its
// cancellation to recovery before the crash point a case is about.
func (b *Bundle) PatientRequests(t testing.TB, payTimeout time.Duration) {
	t.Helper()
	b.Engine = workflow.NewEngine(b.DB.Pool, workflow.Config{Lease: 30 * time.Second, Crash: b.Crashes})
	patient := provider.NewHTTPClient(b.URL, b.Timeout)
	t.Cleanup(patient.CloseIdleConnections)
	b.Canceller = policies.NewCanceller(b.Engine, patient, b.PayClient(t, payTimeout), events.NewWriter(b.Crashes))
}

// Client is a provider client with ProviderTimeout's patience.
func (b *Bundle) Client(t testing.TB) *provider.HTTPClient {
	c := provider.NewHTTPClient(b.URL, ProviderTimeout)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// Worker is one recovery loop and its engine, as another process has them.
type Worker struct {
	*recovery.Loop
	Engine *workflow.Engine
}

// Loop returns a recovery loop over b's database, as instance name, with
// the test's settings (tune changes the defaults). Each loop gets its own
// pool, provider client and engine, as a separate process would.
func (b *Bundle) Loop(t *testing.T, name string, tune func(*recovery.Config)) Worker {
	t.Helper()
	pool, err := database.Open(context.Background(), b.DB.URL, 4) // frugal: the server allows 100 connections for every test running
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	client := provider.NewHTTPClient(b.URL, b.Timeout)
	t.Cleanup(client.CloseIdleConnections)
	engine := workflow.NewEngine(pool, workflow.Config{Lease: 30 * time.Second, Logger: Quiet})
	policies.NewCanceller(engine, client, b.PayClient(t, b.Timeout), events.NewWriter(nil))
	cfg := recovery.DefaultConfig()
	cfg.Instance = name
	cfg.Logger = slog.New(slog.NewTextHandler(TestLog{t}, &slog.HandlerOptions{Level: slog.LevelError}))
	cfg.Lease, cfg.PollInterval, cfg.Backoff, cfg.ClockSkew = 2*time.Second, 100*time.Millisecond, 50*time.Millisecond, 100*time.Millisecond
	if tune != nil {
		tune(&cfg)
	}
	l := recovery.New(engine, cfg)
	l.Register(policies.OperationCancel, engine)
	return Worker{Loop: l, Engine: engine}
}

// Believe sets what the app believes about the provider's idempotency.
func (b *Bundle) Believe(t *testing.T, idempotent bool) {
	t.Helper()
	if _, err := recovery.SetBelief(context.Background(), b.DB.Pool, "provider", idempotent, "the test"); err != nil {
		t.Fatal(err)
	}
}

// Faults are the fake provider's modes a test sets.
type Faults struct {
	Mode       fake.Mode
	Idempotent bool
	StatusMode fake.StatusMode
}

// SetFaults sets the fake provider's faults (answers slowed to 800 ms).
func (b *Bundle) SetFaults(t *testing.T, f Faults) {
	t.Helper()
	fault := fake.DefaultFault()
	fault.Mode, fault.Idempotent, fault.SlowMS = f.Mode, f.Idempotent, 800
	if f.StatusMode != "" {
		fault.StatusMode = f.StatusMode
	}
	if _, err := b.Fake.SetFaults(context.Background(), fault); err != nil {
		t.Fatal(err)
	}
}

// None is "no crash point": the request runs to its end.
const None crash.Point = "none"

// CancelCrashingAt runs a real cancellation that dies at point if it gets
// there (None: it runs to the end), and returns the operation as the
// database has it — ErrNotFound when nothing of it committed.
func (b *Bundle) CancelCrashingAt(t *testing.T, policyID int64, point crash.Point) (workflow.Operation, error) {
	t.Helper()
	ctx := context.Background()
	at := point
	if at == None {
		at = ""
	}
	if err := b.Crashes.Arm(crash.Setting{At: at, Mode: crash.Abandon, Once: true}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != nil && r != http.ErrAbortHandler {
				panic(r)
			}
		}()
		_, err := b.Canceller.Cancel(ctx, policies.CancelRequest{
			UserID: b.Alice, PolicyID: policyID, RequestKey: "key-" + string(point), Actor: "request on app-1",
		}, workflow.Hooks[workflow.Operation]{})
		if err != nil {
			t.Fatalf("Cancel: %v", err)
		}
	}()
	b.Crashes.Arm(crash.Setting{})
	return b.Engine.OperationOf(ctx, policies.OperationCancel, policyID)
}

// Operation is the cancellation of policyID as the database has it.
func (b *Bundle) Operation(t *testing.T, policyID int64) workflow.Operation {
	t.Helper()
	op, err := b.Engine.OperationOf(context.Background(), policies.OperationCancel, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// Settle runs passes of l until every operation is terminal.
func (b *Bundle) Settle(t *testing.T, l Worker) recovery.Counts {
	t.Helper()
	var total recovery.Counts
	for range 30 {
		c, err := l.RunOnce(context.Background())
		if err != nil {
			t.Fatalf("RunOnce: %v", err)
		}
		total = Add(total, c)
		if b.Live(t) == 0 {
			return total
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("operations still live after 30 passes: %d", b.Live(t))
	return total
}

// Live counts the operations someone is (or should be) working on.
func (b *Bundle) Live(t testing.TB) int {
	t.Helper()
	var n int
	if err := b.DB.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Add sums two passes' counts.
func Add(a, c recovery.Counts) recovery.Counts {
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

// Effects counts the provider's cancellations of policyID, pending ones included.
func (b *Bundle) Effects(t *testing.T, policyID int64) int {
	t.Helper()
	eff, err := b.Fake.Effects(context.Background())
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

// Refunds counts the refunds the payments service made for policyID.
func (b *Bundle) Refunds(t *testing.T, policyID int64) int {
	t.Helper()
	var n int
	if err := b.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM fake_payments.ledger WHERE kind = 'refund' AND policy_id = $1`, policyID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// CheckInvariants runs DESIGN.md's invariants (internal/invariants)
// against the app's tables and the provider's ledger.
func CheckInvariants(t *testing.T, db *testdb.DB) {
	t.Helper()
	r, err := invariants.Check(context.Background(), db.Pool, invariants.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant %d: %s (ids %v)", v.Invariant, v.Detail, v.IDs)
	}
}

// Branches lists the recovery branches on an operation's timeline.
func (b *Bundle) Branches(t *testing.T, opID int64) []string {
	t.Helper()
	events, err := readmodel.Timeline(context.Background(), b.DB.Pool, opID)
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

// TestLog sends a loop's errors to the test log.
type TestLog struct{ t *testing.T }

func (w TestLog) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// WaitFor waits up to d for cond, failing the test after.
func WaitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Deref is *s, or "<nil>".
func Deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// PolicyStatus is policyID's status as alice sees it.
func (b *Bundle) PolicyStatus(t *testing.T, policyID int64) string {
	t.Helper()
	p, err := b.Store.Get(context.Background(), b.Alice, policyID)
	if err != nil {
		t.Fatal(err)
	}
	return p.Status
}
