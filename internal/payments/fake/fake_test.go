package fake_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/fault/faketest"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// impatience is the impatient client's per-call timeout: short, so the
// timeout modes cost little. Calls expected to be answered use the patient
// client, so a loaded machine cannot turn an answer into a timeout.
const impatience = 400 * time.Millisecond

// service is one fake payments service over real HTTP, with the real client.
type service struct {
	db        *testdb.DB
	fake      *fake.Payments
	srv       *faketest.Server
	client    *payments.HTTPClient // patient: 5 s
	impatient *payments.HTTPClient
	control   *fake.Control
}

func setup(t *testing.T) *service { t.Helper(); return serve(t, testdb.New(t)) }

// serve starts a service on db; a second serve on the same db is the
// service restarted: a new process, the same durable state.
func serve(t testing.TB, db *testdb.DB) *service {
	t.Helper()
	s := &service{db: db}
	s.fake = fake.New(db.Pool, fake.Options{HoldCap: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s.srv = faketest.Serve(t, s.fake.Handler())
	s.client = payments.NewHTTPClient(s.srv.URL, 5*time.Second)
	s.impatient = payments.NewHTTPClient(s.srv.URL, impatience)
	s.control = fake.NewControl(s.srv.URL, "")
	t.Cleanup(s.stop)
	return s
}

func (s *service) stop() {
	s.closeIdle()
	s.fake.Close()
	s.srv.Close()
}

func (s *service) closeIdle() {
	s.client.CloseIdleConnections()
	s.impatient.CloseIdleConnections()
	s.control.CloseIdleConnections()
}

func (s *service) settled(t *testing.T) { t.Helper(); s.srv.AssertSettled(t, s.closeIdle) }

// set applies f over the defaults (so a test names only what it changes).
func (s *service) set(t *testing.T, change func(*fault.Fault)) {
	t.Helper()
	f := fault.Default()
	change(&f)
	if _, err := s.control.SetFaults(context.Background(), f); err != nil {
		t.Fatalf("set fault %+v: %v", f, err)
	}
}

func (s *service) refund(t *testing.T, c *payments.HTTPClient, key string, policyID int64) external.Result {
	t.Helper()
	res, err := c.Refund(context.Background(), payments.RefundRequest{Key: key, PolicyID: policyID, AmountCents: 1250, Reason: "test"})
	if err != nil {
		t.Fatalf("refund %s: not sent: %v", key, err)
	}
	return res
}

func (s *service) charge(t *testing.T, c *payments.HTTPClient, key string, bookingID int64) external.Result {
	t.Helper()
	res, err := c.Charge(context.Background(), payments.ChargeRequest{Key: key, BookingID: bookingID, AmountCents: 5000, Description: "deposit"})
	if err != nil {
		t.Fatalf("charge %s: not sent: %v", key, err)
	}
	return res
}

// gaveUp fails unless res is the caller's own timeout, then waits for the
// service's handlers so what the test reads next is its settled truth.
func (s *service) gaveUp(t *testing.T, res external.Result) {
	t.Helper()
	if !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Fatalf("result = %s (%v), want the caller's own timeout", res.Outcome, res.Err)
	}
	s.srv.WaitHandlers(t)
}

func (s *service) ledger(t *testing.T) fake.Ledger {
	t.Helper()
	l, err := s.control.Ledger(context.Background())
	if err != nil {
		t.Fatalf("ledger: %v", err)
	}
	return l
}

func wantTruth(t *testing.T, status func(context.Context, string) (external.Truth, error), key string, want external.Truth) {
	t.Helper()
	got, err := status(context.Background(), key)
	if err != nil || got != want {
		t.Fatalf("truth of %s = %s, %v; want %s", key, got, err, want)
	}
}

func want(t *testing.T, res external.Result, outcome external.Outcome, truth external.Truth) {
	t.Helper()
	if res.Outcome != outcome || res.Truth != truth {
		t.Fatalf("result = %s (truth %q, err %v), want %s (truth %q)", res.Outcome, res.Truth, res.Err, outcome, truth)
	}
}

// Every mode, for both kinds of call, through the real client: what the
// caller sees, the truth afterwards, the ledger.
func TestEveryMode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mode     fault.Mode
		outcome  external.Outcome
		answered external.Truth // what the service said, if anything
		truth    external.Truth // its truth afterwards
		applied  int64
		pending  int64
		timeout  bool // the caller gives up waiting
	}{
		{fault.ModeOK, external.Confirmed, external.TruthCompleted, external.TruthCompleted, 1, 0, false},
		{fault.ModeReject, external.Rejected, external.TruthRejected, external.TruthRejected, 0, 0, false},
		{fault.ModeError, external.Unknown, "", external.TruthNotStarted, 0, 0, false},
		{fault.ModeDrop, external.Unknown, "", external.TruthNotStarted, 0, 0, true},
		{fault.ModeLostResponse, external.Unknown, "", external.TruthCompleted, 1, 0, true},
		{fault.ModeSlow, external.Unknown, "", external.TruthRunning, 0, 1, true},
	}
	for _, kind := range []string{"charge", "refund"} {
		for _, tt := range tests {
			t.Run(kind+"/"+string(tt.mode), func(t *testing.T) {
				t.Parallel()
				s := setup(t)
				s.set(t, func(f *fault.Fault) { f.Mode, f.SlowMS = tt.mode, 60_000 })
				c := s.client
				if tt.timeout {
					c = s.impatient
				}
				var res external.Result
				var status func(context.Context, string) (external.Truth, error)
				var totals func(fake.Ledger) fake.Totals
				if kind == "charge" {
					res, status, totals = s.charge(t, c, "k1", 3), s.client.ChargeStatus, func(l fake.Ledger) fake.Totals { return l.Charges }
				} else {
					res, status, totals = s.refund(t, c, "k1", 7), s.client.RefundStatus, func(l fake.Ledger) fake.Totals { return l.Refunds }
				}
				if tt.timeout {
					s.gaveUp(t, res)
				}
				want(t, res, tt.outcome, tt.answered)
				var se *external.StatusError
				if tt.mode == fault.ModeError && (!errors.As(res.Err, &se) || se.StatusCode != http.StatusServiceUnavailable) {
					t.Fatalf("cause = %v, want HTTP 503", res.Err)
				}
				if tt.outcome == external.Rejected && res.Reason == "" {
					t.Fatal("a rejection carries no reason")
				}
				wantTruth(t, status, "k1", tt.truth)
				l := s.ledger(t)
				if got := totals(l); got.Count != tt.applied || got.Pending != tt.pending {
					t.Fatalf("%s totals = %+v, want %d applied, %d pending", kind, got, tt.applied, tt.pending)
				}
				if tt.applied == 1 && (len(l.Entries) != 1 || l.Entries[0].Key != "k1" || l.Entries[0].Kind != kind) {
					t.Fatalf("entries = %+v", l.Entries)
				}
				s.settled(t)
			})
		}
	}
}

func TestSlowWithinTheCallersPatienceIsConfirmed(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.set(t, func(f *fault.Fault) { f.Mode, f.SlowMS = fault.ModeSlow, 30 })
	want(t, s.refund(t, s.client, "k", 7), external.Confirmed, external.TruthCompleted)
	if l := s.ledger(t); l.Refunds.Count != 1 || l.Refunds.AmountCents != 1250 {
		t.Fatalf("refunds = %+v", l.Refunds)
	}
}

// Concurrent copies of one refund: one movement when idempotent, one per
// copy when not — the double refund the app must never cause.
func TestConcurrentRefundsWithOneKey(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		t.Run(fmt.Sprint("idempotent=", idempotent), func(t *testing.T) {
			t.Parallel()
			s := setup(t)
			s.set(t, func(f *fault.Fault) { f.Idempotent = idempotent })
			const n = 12
			start := make(chan struct{})
			results := make([]external.Result, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					results[i], _ = s.client.Refund(context.Background(), payments.RefundRequest{Key: "same", PolicyID: 9, AmountCents: 100})
				})
			}
			close(start)
			wg.Wait()
			for _, res := range results {
				want(t, res, external.Confirmed, external.TruthCompleted)
			}
			wantN := int64(1)
			if !idempotent {
				wantN = n
			}
			l := s.ledger(t)
			if l.Refunds.Count != wantN || len(l.BySubject) != 1 || l.BySubject[0].Refunds != wantN || *l.BySubject[0].PolicyID != 9 {
				t.Fatalf("ledger = %+v, want %d refunds of policy 9", l, wantN)
			}
		})
	}
}

func TestRepeats(t *testing.T) {
	t.Parallel()
	t.Run("idempotent: the retry after a lost response refunds nothing more", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		s.set(t, func(f *fault.Fault) { f.Mode, f.Next = fault.ModeLostResponse, 1 })
		s.gaveUp(t, s.refund(t, s.impatient, "k", 5))
		want(t, s.refund(t, s.client, "k", 5), external.Confirmed, external.TruthCompleted)
		if l := s.ledger(t); l.Refunds.Count != 1 {
			t.Fatalf("refunds = %d, want 1", l.Refunds.Count)
		}
	})
	t.Run("not idempotent: the retry refunds again, visibly", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		s.set(t, func(f *fault.Fault) { f.Idempotent = false })
		s.set(t, func(f *fault.Fault) { f.Mode, f.Idempotent, f.Next = fault.ModeLostResponse, false, 1 })
		s.gaveUp(t, s.refund(t, s.impatient, "k", 5))
		want(t, s.refund(t, s.client, "k", 5), external.Confirmed, external.TruthCompleted)
		l := s.ledger(t)
		if l.Refunds.Count != 2 || l.BySubject[0].Refunds != 2 || l.BySubject[0].RefundedCents != 2500 {
			t.Fatalf("ledger = %+v, want policy 5 refunded twice", l)
		}
	})
	t.Run("a key reused for another policy is refused", func(t *testing.T) {
		t.Parallel()
		s := setup(t)
		want(t, s.refund(t, s.client, "k", 5), external.Confirmed, external.TruthCompleted)
		res := s.refund(t, s.client, "k", 6)
		var se *external.StatusError
		if res.Outcome != external.Unknown || !errors.As(res.Err, &se) || se.StatusCode != http.StatusConflict || se.Code != "key_reused" {
			t.Fatalf("result = %+v, want Unknown with 409 key_reused", res)
		}
		if l := s.ledger(t); l.Refunds.Count != 1 {
			t.Fatalf("refunds = %d, want 1", l.Refunds.Count)
		}
	})
}

// The deposit saga's half: charge a booking by key, read its status, refund
// the charge — and the refund rules that keep money from leaking.
func TestRefundsOfACharge(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := context.Background()
	refundOf := func(key, charge string, cents int64) external.Result {
		t.Helper()
		res, err := s.client.Refund(ctx, payments.RefundRequest{Key: key, ChargeKey: charge, AmountCents: cents})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	res := refundOf("r0", "no-such-charge", 100)
	want(t, res, external.Rejected, external.TruthRejected)
	if !strings.Contains(res.Reason, "no charge no-such-charge") {
		t.Fatalf("reason %q", res.Reason)
	}

	s.set(t, func(f *fault.Fault) { f.Mode, f.SlowMS, f.Next = fault.ModeSlow, 60_000, 1 })
	s.gaveUp(t, s.charge(t, s.impatient, "running", 4))
	if res := refundOf("r1", "running", 100); res.Outcome != external.Rejected || !strings.Contains(res.Reason, "is RUNNING") {
		t.Fatalf("refund of a running charge = %+v", res)
	}

	want(t, s.charge(t, s.client, "dep-1", 3), external.Confirmed, external.TruthCompleted)
	wantTruth(t, s.client.ChargeStatus, "dep-1", external.TruthCompleted)
	want(t, refundOf("r2", "dep-1", 3000), external.Confirmed, external.TruthCompleted)
	if res := refundOf("r3", "dep-1", 2001); res.Outcome != external.Rejected || !strings.Contains(res.Reason, "2000 cents that remain") {
		t.Fatalf("over-refund = %+v", res)
	}
	// Concurrent refunds of what remains: the charge's row lock lets one win.
	const n = 8
	start := make(chan struct{})
	results := make([]external.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], _ = s.client.Refund(ctx, payments.RefundRequest{Key: fmt.Sprint("rest-", i), ChargeKey: "dep-1", AmountCents: 2000})
		})
	}
	close(start)
	wg.Wait()
	confirmed := 0
	for _, r := range results {
		if r.Outcome == external.Confirmed {
			confirmed++
		}
	}
	var line fake.SubjectLine
	for _, sl := range s.ledger(t).BySubject {
		if sl.BookingID != nil && *sl.BookingID == 3 {
			line = sl
		}
	}
	if confirmed != 1 || line.Charges != 1 || line.Refunds != 2 || line.ChargedCents != 5000 || line.RefundedCents != 5000 {
		t.Fatalf("%d of %d refunds of the rest confirmed; booking line %+v", confirmed, n, line)
	}
}

func TestTruthAndFaultsSurviveARestart(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.set(t, func(f *fault.Fault) { f.Mode = fault.ModeLostResponse })
	s.set(t, func(f *fault.Fault) { f.Mode, f.BookingID = fault.ModeReject, new(int64(8)) })
	s.gaveUp(t, s.refund(t, s.impatient, "lost", 7))
	s.stop() // the service's process dies

	again := serve(t, s.db)
	wantTruth(t, again.client.RefundStatus, "lost", external.TruthCompleted)
	wantTruth(t, again.client.RefundStatus, "never", external.TruthNotStarted)
	if l := again.ledger(t); l.Refunds.Count != 1 {
		t.Fatalf("refunds after restart = %d, want 1", l.Refunds.Count)
	}
	cfg, err := again.control.Faults(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Global.Mode != fault.ModeLostResponse || len(cfg.Overrides) != 1 || *cfg.Overrides[0].BookingID != 8 {
		t.Fatalf("faults after restart = %+v, want them kept", cfg)
	}
	want(t, again.charge(t, again.client, "c8", 8), external.Rejected, external.TruthRejected) // the override still holds
}

func TestScriptsAreUsedExactlyOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.set(t, func(f *fault.Fault) { f.Mode = fault.ModeError })
	s.set(t, func(f *fault.Fault) { f.Mode, f.Next = fault.ModeOK, 3 })
	s.set(t, func(f *fault.Fault) { f.Mode, f.Next = fault.ModeReject, 2 })
	const n = 10
	start := make(chan struct{})
	results := make([]external.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], _ = s.client.Charge(context.Background(), payments.ChargeRequest{Key: fmt.Sprint("k", i), PolicyID: 1, AmountCents: 10})
		})
	}
	close(start)
	wg.Wait()
	count := map[external.Outcome]int{}
	for _, res := range results {
		count[res.Outcome]++
	}
	if count[external.Confirmed] != 3 || count[external.Rejected] != 2 || count[external.Unknown] != 5 {
		t.Fatalf("outcomes = %v, want 3 confirmed, 2 rejected, 5 unknown (the global error)", count)
	}
	if cfg, _ := s.control.Faults(context.Background()); len(cfg.Script) != 0 {
		t.Fatalf("script left = %+v", cfg.Script)
	}
}

func TestScopes(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.set(t, func(f *fault.Fault) { f.Mode = fault.ModeReject })
	s.set(t, func(f *fault.Fault) { f.Mode, f.BookingID = fault.ModeOK, new(int64(7)) })
	s.set(t, func(f *fault.Fault) { f.Mode, f.PolicyID = fault.ModeOK, new(int64(7)) })

	want(t, s.charge(t, s.client, "b7", 7), external.Confirmed, external.TruthCompleted) // the booking's override beats the global
	want(t, s.refund(t, s.client, "p7", 7), external.Confirmed, external.TruthCompleted) // so does the policy's
	want(t, s.charge(t, s.client, "b8", 8), external.Rejected, external.TruthRejected)   // no override: global
	// A refund of booking 7's charge is governed by booking 7's override.
	res, _ := s.client.Refund(context.Background(), payments.RefundRequest{Key: "rb7", ChargeKey: "b7", AmountCents: 10})
	want(t, res, external.Confirmed, external.TruthCompleted)

	s.set(t, func(f *fault.Fault) { f.Mode, f.BookingID, f.Next = fault.ModeError, new(int64(7)), 1 })
	want(t, s.charge(t, s.client, "b7b", 7), external.Unknown, "") // the script beats the override
	want(t, s.charge(t, s.client, "b7c", 7), external.Confirmed, external.TruthCompleted)
}

func TestStatusFaults(t *testing.T) {
	t.Parallel()
	s := setup(t)
	want(t, s.refund(t, s.client, "k", 1), external.Confirmed, external.TruthCompleted)
	s.set(t, func(f *fault.Fault) { f.StatusMode = fault.StatusError })
	_, err := s.client.RefundStatus(context.Background(), "k")
	var se *external.StatusError
	if !errors.Is(err, external.ErrUnreachable) || !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %v, want ErrUnreachable from 503", err)
	}
	s.set(t, func(f *fault.Fault) { f.StatusMode = fault.StatusDrop })
	if _, err := s.impatient.ChargeStatus(context.Background(), "k"); !errors.Is(err, external.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("status = %v, want ErrUnreachable from a timeout", err)
	}
	s.settled(t)
}

func TestLatencyBeyondTheTimeoutLosesTheAnswer(t *testing.T) {
	t.Parallel()
	s := setup(t)
	s.set(t, func(f *fault.Fault) { f.LatencyMS, f.Next = 2000, 1 }) // a script entry: status queries stay fast
	s.gaveUp(t, s.refund(t, s.impatient, "k", 1))
	wantTruth(t, s.client.RefundStatus, "k", external.TruthCompleted)
	s.settled(t)
}

// A refund held in the network past its deadline is refused when it gets
// in; the caller, told NOT_STARTED, retries on time with the same key, and
// the policy is refunded exactly once.
func TestARefundHeldPastItsDeadlineIsRefused(t *testing.T) {
	t.Parallel()
	s := setup(t)
	proxy, err := netfault.Listen(strings.TrimPrefix(s.srv.URL, "http://"), netfault.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s.set(t, func(f *fault.Fault) { f.Idempotent = false }) // a second effect would be a double refund
	through := payments.NewHTTPClient(proxy.URL(), impatience)
	defer through.CloseIdleConnections()

	proxy.HoldNext(1, 1500*time.Millisecond, "POST /v1/refunds")
	deadline := through.Deadline()
	res, err := through.Refund(context.Background(), payments.RefundRequest{Key: "op-3:refund", PolicyID: 3, AmountCents: 999, Deadline: deadline})
	if err != nil || res.Outcome != external.Unknown || !errors.Is(res.Err, context.DeadlineExceeded) || !res.Deadline.Equal(deadline) {
		t.Fatalf("result = %+v, %v; want Unknown from the caller's timeout", res, err)
	}
	wantTruth(t, s.client.RefundStatus, "op-3:refund", external.TruthNotStarted) // true, for now

	var l fake.Ledger
	for wait := time.Now().Add(10 * time.Second); l.Late.Total == 0; l = s.ledger(t) {
		if time.Now().After(wait) {
			t.Fatal("the held refund never reached the ledger")
		}
		time.Sleep(20 * time.Millisecond)
	}
	late := l.Late.Recent[0]
	if late.Key != "op-3:refund" || *late.PolicyID != 3 || !late.Deadline.Equal(deadline) || late.LateMS < 1000 ||
		!strings.Contains(late.Message, "after its deadline") {
		t.Fatalf("late = %+v", late)
	}
	if l.Refunds.Count != 0 {
		t.Fatalf("refunds = %+v: the late refund was applied", l.Refunds)
	}
	wantTruth(t, s.client.RefundStatus, "op-3:refund", external.TruthNotStarted)

	want(t, s.refund(t, s.client, "op-3:refund", 3), external.Confirmed, external.TruthCompleted)
	if l := s.ledger(t); l.Refunds.Count != 1 {
		t.Fatalf("refunds after the on-time retry = %d, want 1", l.Refunds.Count)
	}
	s.settled(t)
}

func TestFaultBoundsAndJSON(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, tt := range []struct {
		body, contentType string
		status            int
		field             string
	}{
		{`{"mode":"slow","slow_ms":9223372036854775807}`, "application/json", 422, "slow_ms"},
		{`{"mode":"flaky","weights":{"ok":9223372036854775807}}`, "application/json", 422, "weights.ok"},
		{`{"mode":"ok","booking_id":-4}`, "application/json", 422, "booking_id"},
		{`{"mode":"ok","booking_id":4,"policy_id":4}`, "application/json", 422, "booking_id"},
		{`{"mode":"ok","amount":4}`, "application/json", 400, ""},
		{`{"mode":"drop"}`, "text/plain", 415, ""},
	} {
		req, _ := http.NewRequest(http.MethodPut, s.srv.URL+"/v1/faults", strings.NewReader(tt.body))
		req.Header.Set("Content-Type", tt.contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || (tt.field != "" && !strings.Contains(string(raw), `"field":"`+tt.field+`"`)) {
			t.Errorf("PUT %s: %d %s, want %d field %q", tt.body, resp.StatusCode, raw, tt.status, tt.field)
		}
	}
	if cfg, _ := s.control.Faults(context.Background()); cfg.Global.Mode != fault.ModeOK || len(cfg.Overrides)+len(cfg.Script) != 0 {
		t.Fatalf("a refused PUT changed the faults: %+v", cfg)
	}
}

func TestCallsTheServiceRefusesToRead(t *testing.T) {
	t.Parallel()
	s := setup(t)
	for _, body := range []string{
		`{"amount_cents":100}`,                               // for nothing
		`{"policy_id":1,"booking_id":2,"amount_cents":100}`,  // for two things
		`{"booking_id":2,"amount_cents":0}`,                  // nothing to charge
		`{"booking_id":2,"amount_cents":100000001}`,          // too much
		`{"booking_id":9007199254740992,"amount_cents":100}`, // an id out of range
		`{"booking_id":2,"amount_cents":1e40}`,               // not even a number it can hold
	} {
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/v1/charges", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /v1/charges %s: %d, want 400", body, resp.StatusCode)
		}
	}
	wantTruth(t, s.client.ChargeStatus, "k", external.TruthNotStarted)
	// the client refuses the same before sending anything
	for _, req := range []payments.ChargeRequest{
		{Key: "k", AmountCents: 1}, {Key: "k", PolicyID: 1, BookingID: 1, AmountCents: 1}, {Key: "k", BookingID: 1},
		{Key: "k", BookingID: 1, AmountCents: payments.MaxAmountCents + 1}, {Key: "", BookingID: 1, AmountCents: 1},
	} {
		if _, err := s.client.Charge(context.Background(), req); !errors.Is(err, external.ErrInvalidRequest) {
			t.Errorf("Charge(%+v): err = %v, want ErrInvalidRequest", req, err)
		}
	}
}

func TestFlakyReplaysItsSeed(t *testing.T) {
	t.Parallel()
	run := func(seed int64) []external.Outcome {
		s := setup(t)
		s.set(t, func(f *fault.Fault) {
			f.Mode, f.Seed, f.Weights = fault.ModeFlaky, seed, fault.Weights{fault.ModeOK: 1, fault.ModeReject: 1, fault.ModeError: 1}
		})
		var got []external.Outcome
		for i := range 12 {
			got = append(got, s.refund(t, s.client, fmt.Sprint("k", i), 1).Outcome)
		}
		return got
	}
	first, again, other := run(42), run(42), run(7)
	if fmt.Sprint(first) != fmt.Sprint(again) || fmt.Sprint(first) == fmt.Sprint(other) {
		t.Fatalf("seed 42: %v then %v; seed 7: %v", first, again, other)
	}
}

func TestControlAPIAccessAndReset(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	p := fake.New(db.Pool, fake.Options{Control: fault.Access{Token: "s3cret"}})
	defer p.Close()
	srv := faketest.Serve(t, p.Handler())

	anon := fake.NewControl(srv.URL, "")
	defer anon.CloseIdleConnections()
	if _, err := anon.Ledger(context.Background()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("ledger without the token: %v, want HTTP 401", err)
	}
	ctl := fake.NewControl(srv.URL, "s3cret")
	defer ctl.CloseIdleConnections()
	c := payments.NewHTTPClient(srv.URL, 5*time.Second)
	defer c.CloseIdleConnections()
	if res, _ := c.Refund(context.Background(), payments.RefundRequest{Key: "k", PolicyID: 1, AmountCents: 5}); res.Outcome != external.Confirmed {
		t.Fatalf("the business API is open to clients: %+v", res)
	}
	f := fault.Default()
	f.Mode = fault.ModeError
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := ctl.Ledger(context.Background())
	if err != nil || l.Refunds.Count != 0 || len(l.Entries) != 0 {
		t.Fatalf("ledger after reset = %+v, %v", l, err)
	}
	if cfg, _ := ctl.Faults(context.Background()); cfg.Global.Mode != fault.ModeOK {
		t.Fatalf("faults after reset = %+v", cfg.Global)
	}
	if tr, _ := p.RefundTruth(context.Background(), "k"); tr != external.TruthNotStarted {
		t.Fatalf("truth after reset = %s", tr)
	}
}
