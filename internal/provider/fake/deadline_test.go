package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

// The delayed original (issue 11, finding 1): the call is held in the
// network past the caller's timeout; the caller asks the status and hears
// NOT_STARTED; then the original arrives. Without a deadline it would be
// applied after the caller was told it had not started. With one, it is
// refused, durably and visibly, and the retry with the same key — on time —
// is applied exactly once.
func TestACallHeldPastItsDeadlineIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, err := netfault.Listen(strings.TrimPrefix(b.srv.URL, "http://"), netfault.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: false}) // a retry would double the effect
	through := provider.NewHTTPClient(proxy.URL(), callerTimeout)
	defer through.CloseIdleConnections()

	const hold = 1500 * time.Millisecond
	proxy.HoldNext(1, hold, "POST /v1/cancellations")
	deadline := through.Deadline() // the caller records it first
	res, err := through.Cancel(context.Background(), provider.CancelRequest{Key: "op-1:provider_cancel", PolicyID: 7, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != provider.Unknown || !errors.Is(res.Err, context.DeadlineExceeded) || !res.Deadline.Equal(deadline) {
		t.Fatalf("result = %+v, want Unknown from the caller's timeout, with its deadline", res)
	}
	// Asked now, the provider truthfully says NOT_STARTED: the call is still on its way.
	b.wantTruth(t, "op-1:provider_cancel", provider.TruthNotStarted)

	// The original arrives after its deadline and is refused.
	var late *fault.LateArrivals
	for wait := time.Now().Add(10 * time.Second); late == nil; {
		if time.Now().After(wait) {
			t.Fatal("the held call never reached the provider's ledger")
		}
		time.Sleep(20 * time.Millisecond)
		late = b.effects(t).Late
	}
	l := late.Recent[0]
	if late.Total != 1 || l.Key != "op-1:provider_cancel" || *l.PolicyID != 7 || !l.Deadline.Equal(deadline) {
		t.Fatalf("late = %+v, want the held call with its deadline", late)
	}
	if min := hold - callerTimeout - 50*time.Millisecond; time.Duration(l.LateMS)*time.Millisecond < min ||
		!strings.Contains(l.Message, "after its deadline") {
		t.Fatalf("late by %d ms (%q), want at least %v", l.LateMS, l.Message, min)
	}
	b.wantTruth(t, "op-1:provider_cancel", provider.TruthNotStarted)
	if e := b.effects(t); e.Total != 0 || e.Pending != 0 {
		t.Fatalf("effects = %+v: the late call was applied", e)
	}

	// NOT_STARTED is now conclusive: the retry, with the same key and a new
	// deadline, is applied once.
	wantOutcome(t, b.cancel(t, "op-1:provider_cancel", 7), provider.Confirmed, provider.TruthCompleted)
	if e := b.effects(t); e.Total != 1 {
		t.Fatalf("effects after the retry = %d, want 1", e.Total)
	}
	b.assertSettled(t)
}

func TestALateCallIsAnswered408(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setFault(t, fake.Fault{Mode: fake.ModeOK, Idempotent: true, Next: 1})
	deadline := time.Now().Add(-1300 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/cancellations", strings.NewReader(`{"policy_id":5}`))
	req.Header.Set("Idempotency-Key", "late-1")
	req.Header.Set(external.DeadlineHeader, external.FormatDeadline(deadline))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Error   string `json:"error"`
		Message string `json:"message"`
		LateMS  int64  `json:"late_ms"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusRequestTimeout || body.Error != "deadline_passed" || body.LateMS < 1300 ||
		!strings.Contains(body.Message, "late-1 arrived 1.") {
		t.Fatalf("answer = %d %+v, want 408 deadline_passed about 1.3 s late", resp.StatusCode, body)
	}
	b.wantTruth(t, "late-1", provider.TruthNotStarted)
	// the script entry is still there for the next on-time call
	if cfg, _ := b.control.Faults(context.Background()); len(cfg.Script) != 1 {
		t.Fatalf("script = %+v", cfg.Script)
	}

	// An unreadable deadline is a bad request, not a missing one.
	req, _ = http.NewRequest(http.MethodPost, b.srv.URL+"/v1/cancellations", strings.NewReader(`{"policy_id":5}`))
	req.Header.Set("Idempotency-Key", "late-2")
	req.Header.Set(external.DeadlineHeader, "tomorrow")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("deadline %q: %d, want 400", "tomorrow", resp.StatusCode)
	}
}

func TestTheControlAPIWantsItsToken(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	p := fake.New(db.Pool, fake.Options{Control: fault.Access{Token: "s3cret"}})
	defer p.Close()
	srv := httptestServer(t, p.Handler())

	for _, path := range []string{"/v1/faults", "/v1/effects"} {
		resp, err := http.Get(srv + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d, want 401", path, resp.StatusCode)
		}
	}
	anon := fake.NewControl(srv)
	defer anon.CloseIdleConnections()
	if err := anon.Reset(context.Background()); err == nil {
		t.Error("a reset without the token was accepted")
	}
	ctl := fake.NewControlWithToken(srv, "s3cret")
	defer ctl.CloseIdleConnections()
	f := fake.DefaultFault()
	f.Mode = fake.ModeReject
	if _, err := ctl.SetFaults(context.Background(), f); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	// The business API stays open to every client.
	c := provider.NewHTTPClient(srv, 5*time.Second)
	defer c.CloseIdleConnections()
	if res, err := c.Cancel(context.Background(), provider.CancelRequest{Key: "k", PolicyID: 1}); err != nil || res.Outcome != provider.Rejected {
		t.Fatalf("cancel = %+v, %v; want the fault set with the token", res, err)
	}
}

// httptestServer serves h on loopback for the test and returns its URL.
func httptestServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
