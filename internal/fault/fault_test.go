package fault_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/testdb"
)

// bundle is one fault store served over real HTTP by the shared control API,
// as a fake serves it.
type bundle struct {
	db      *testdb.DB
	store   *fault.Store
	srv     *httptest.Server
	control *fault.ControlClient
}

func setup(t *testing.T, kinds ...string) *bundle {
	t.Helper()
	db := testdb.New(t)
	b := &bundle{db: db, store: fault.NewStore(db.Pool, "testsys", kinds...)}
	mux := http.NewServeMux()
	fault.ControlAPI{Store: b.store, Reset: func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error { return b.store.Reset(ctx, tx) })
	}}.Register(mux, fault.Access{})
	b.srv = httptest.NewServer(mux)
	b.control = fault.NewControlClient(b.srv.URL, "")
	t.Cleanup(func() { b.control.CloseIdleConnections(); b.srv.Close() })
	return b
}

func (b *bundle) put(t *testing.T, contentType, body string) (int, fault.ErrorBody) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, b.srv.URL+"/v1/faults", strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e fault.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e
}

func TestEveryNumberIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, "policy")
	tests := []struct {
		body   string
		status int
		field  string // for 422
	}{
		// issue 18: the values that once answered 502 or panicked every call
		{`{"mode":"slow","slow_ms":9223372036854775807}`, 422, "slow_ms"},
		{`{"mode":"ok","latency_ms":9223372036854775807}`, 422, "latency_ms"},
		{`{"mode":"flaky","weights":{"ok":9223372036854775807,"error":9223372036854775807}}`, 422, "weights.ok"},
		// numbers that do not even fit the field's type
		{`{"mode":"slow","slow_ms":100000000000000000000000000000}`, 422, "slow_ms"},
		{`{"mode":"flaky","weights":{"ok":1e30}}`, 422, "weights"},
		{`{"mode":"ok","seed":18446744073709551616}`, 422, "seed"},
		// each bound, one past it
		{`{"mode":"slow","slow_ms":600001}`, 422, "slow_ms"},
		{`{"mode":"slow","slow_ms":-1}`, 422, "slow_ms"},
		{`{"mode":"ok","latency_ms":60001}`, 422, "latency_ms"},
		{`{"mode":"ok","next":10001}`, 422, "next"},
		{`{"mode":"ok","next":-1}`, 422, "next"},
		{`{"mode":"ok","seed":-1}`, 422, "seed"},
		{`{"mode":"ok","seed":9007199254740992}`, 422, "seed"},
		{`{"mode":"ok","policy_id":0}`, 422, "policy_id"},
		{`{"mode":"ok","policy_id":9007199254740992}`, 422, "policy_id"},
		{`{"mode":"flaky","weights":{"ok":1001}}`, 422, "weights.ok"},
		{`{"mode":"flaky","weights":{"ok":-1,"error":2}}`, 422, "weights.ok"},
		{`{"mode":"flaky","weights":{"ok":0,"error":0}}`, 422, "weights"},
		{`{"mode":"flaky","weights":{}}`, 422, "weights"},
		{`{"mode":"flaky","weights":{"flaky":1}}`, 422, "weights"},
		// not numbers, but refused the same way
		{`{"mode":"explode"}`, 422, "mode"},
		{`{"mode":"ok","status_mode":"maybe"}`, 422, "status_mode"},
		{`{"mode":"ok","status_mode":"error","policy_id":3}`, 422, "status_mode"},
		{`{"mode":"ok","booking_id":3}`, 422, "booking_id"}, // this system scopes by policy only
		// not one fault object
		{`{"mode":"ok","colour":"red"}`, 400, ""},
		{`{"mode":"ok"} {"mode":"drop"}`, 400, ""},
		{`{"mode":`, 400, ""},
		{`{"mode":5}`, 400, ""},
		{`[]`, 400, ""},
		{``, 400, ""},
	}
	for _, tt := range tests {
		status, e := b.put(t, "application/json", tt.body)
		if status != tt.status || (tt.status == 422 && (e.Error != "invalid_fault" || e.Field != tt.field)) {
			t.Errorf("PUT %s = %d %+v, want %d field %q", tt.body, status, e, tt.status, tt.field)
		}
		if status == 422 && !strings.Contains(e.Message, "range") && tt.field != "mode" && tt.field != "status_mode" &&
			tt.field != "booking_id" && tt.field != "weights" {
			t.Errorf("PUT %s: message %q does not give the range", tt.body, e.Message)
		}
	}
	// The bounds themselves are accepted.
	for _, body := range []string{
		`{"mode":"slow","slow_ms":600000,"latency_ms":60000,"next":10000,"seed":9007199254740991,"policy_id":9007199254740991}`,
		`{"mode":"flaky","weights":{"ok":1000,"reject":1000,"error":1000,"drop":1000,"lost_response":1000,"slow":1000}}`,
		`{"mode":"flaky","weights":{"drop":1}}`,
	} {
		if status, e := b.put(t, "application/json", body); status != 200 {
			t.Errorf("PUT %s = %d %+v, want 200", body, status, e)
		}
	}
}

func TestPutTakesJSONOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, "policy")
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/jsonx", "garbage;;"} {
		if status, e := b.put(t, ct, `{"mode":"drop"}`); status != http.StatusUnsupportedMediaType || e.Error != "unsupported_media_type" {
			t.Errorf("Content-Type %q: %d %+v, want 415", ct, status, e)
		}
	}
	if cfg, err := b.control.Faults(context.Background()); err != nil || cfg.Global.Mode != fault.ModeOK {
		t.Fatalf("a refused PUT changed the faults: %+v, %v", cfg.Global, err)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", ""} {
		if status, _ := b.put(t, ct, `{"mode":"drop"}`); status != http.StatusOK {
			t.Errorf("Content-Type %q: %d, want 200", ct, status)
		}
	}
}

func TestControlClientNamesTheRefusedField(t *testing.T) {
	t.Parallel()
	b := setup(t, "policy", "booking")
	f := fault.Default()
	f.SlowMS = fault.MaxSlowMS + 1
	_, err := b.control.SetFaults(context.Background(), f)
	var invalid *fault.InvalidError
	if !errors.As(err, &invalid) || invalid.Field != "slow_ms" || !errors.Is(err, fault.ErrInvalidFault) {
		t.Fatalf("err = %v, want an InvalidError for slow_ms", err)
	}
	// A store that knows bookings takes a booking override and reads it back.
	f = fault.Default()
	f.Mode, f.BookingID = fault.ModeReject, new(int64(3))
	cfg, err := b.control.SetFaults(context.Background(), f)
	if err != nil || len(cfg.Overrides) != 1 || cfg.Overrides[0].BookingID == nil || *cfg.Overrides[0].BookingID != 3 || cfg.Overrides[0].PolicyID != nil {
		t.Fatalf("config = %+v, %v; want one override for booking 3", cfg, err)
	}
	f.PolicyID = new(int64(4))
	if _, err := b.control.SetFaults(context.Background(), f); !errors.As(err, &invalid) || invalid.Field != "booking_id" {
		t.Fatalf("policy and booking at once: err = %v", err)
	}
}

func TestDecodeStartsFromTheDefaults(t *testing.T) {
	t.Parallel()
	var f fault.Fault
	if err := json.Unmarshal([]byte(`{"mode":"drop"}`), &f); err != nil {
		t.Fatal(err)
	}
	if d := fault.Default(); !f.Idempotent || f.SlowMS != d.SlowMS || f.StatusMode != fault.StatusOK || len(f.Weights) != len(d.Weights) {
		t.Fatalf("decoded %+v, want an idempotent drop with the defaults", f)
	}
	if err := json.Unmarshal([]byte(`{"mode":"flaky","weights":{"ok":1}}`), &f); err != nil || len(f.Weights) != 1 {
		t.Fatalf("weights %v, %v: a given object replaces the defaults", f.Weights, err)
	}
}

func TestArriveRefusesALateCall(t *testing.T) {
	t.Parallel()
	b := setup(t, "policy")
	ctx := context.Background()
	f := fault.Default()
	f.Mode, f.Next = fault.ModeReject, 1
	if _, err := b.store.Set(ctx, f); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(-1300 * time.Millisecond)
	_, err := b.store.Arrive(ctx, fault.Arrival{Key: "op-7:refund", Subject: fault.Policy(7), Deadline: deadline})
	var late *fault.LateError
	if !errors.As(err, &late) || !errors.Is(err, fault.ErrLate) {
		t.Fatalf("err = %v, want a LateError", err)
	}
	if l := late.Late(); l < 1300*time.Millisecond || l > 30*time.Second {
		t.Fatalf("late by %v, want about 1.3 s", l)
	}
	if !strings.Contains(late.Error(), "op-7:refund arrived 1.") || !strings.Contains(late.Error(), " s after its deadline") {
		t.Fatalf("message %q", late.Error())
	}

	// Durable, visible, and nothing else changed: the script entry is still there.
	la, err := b.store.Late(ctx, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if la.Total != 1 || len(la.Recent) != 1 || la.Recent[0].Key != "op-7:refund" || *la.Recent[0].PolicyID != 7 ||
		la.Recent[0].LateMS < 1300 || !la.Recent[0].Deadline.Equal(deadline.Truncate(time.Microsecond)) {
		t.Fatalf("late arrivals = %+v", la)
	}
	if cfg, _ := b.store.Config(ctx); len(cfg.Script) != 1 {
		t.Fatalf("script = %+v: a late call used up an entry", cfg.Script)
	}

	// On time, and without a deadline, the call is governed by the script.
	for _, d := range []time.Time{time.Now().Add(time.Minute), {}} {
		call, err := b.store.Arrive(ctx, fault.Arrival{Key: "op-8:refund", Subject: fault.Policy(8), Deadline: d})
		if err != nil {
			t.Fatalf("deadline %v: %v", d, err)
		}
		if d.IsZero() != (call.Mode == fault.ModeOK) {
			t.Fatalf("deadline %v: mode %s (the script entry goes to the first on-time call)", d, call.Mode)
		}
	}

	// Reset forgets the refusals too.
	if err := b.control.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if la, _ := b.store.Late(ctx, b.db.Pool); la.Total != 0 {
		t.Fatalf("late arrivals after reset = %+v", la)
	}
}

func TestFlakyDrawsReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, "policy")
	ctx := context.Background()
	draws := func() []fault.Mode {
		f := fault.Default()
		f.Mode, f.Seed, f.Weights = fault.ModeFlaky, 42, fault.Weights{fault.ModeOK: 1, fault.ModeError: 1, fault.ModeDrop: 1}
		if _, err := b.store.Set(ctx, f); err != nil { // setting restarts the sequence
			t.Fatal(err)
		}
		var got []fault.Mode
		for range 16 {
			call, err := b.store.Arrive(ctx, fault.Arrival{Key: "k", Subject: fault.Policy(1)})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, call.Mode)
		}
		return got
	}
	first, again := draws(), draws()
	kinds := map[fault.Mode]bool{}
	for i := range first {
		if first[i] != again[i] {
			t.Fatalf("seed 42 drew %v, then %v", first, again)
		}
		kinds[first[i]] = true
	}
	if len(kinds) < 2 || kinds[fault.ModeReject] {
		t.Fatalf("drew %v: want a mix of ok, error and drop only", first)
	}
}

func TestAccess(t *testing.T) {
	t.Parallel()
	ok := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }
	tests := []struct {
		name   string
		access fault.Access
		remote string
		auth   string
		want   int
	}{
		{"default: loopback v4", fault.Access{}, "127.0.0.1:5000", "", http.StatusTeapot},
		{"default: loopback v6", fault.Access{}, "[::1]:5000", "", http.StatusTeapot},
		{"default: another host", fault.Access{}, "10.0.0.7:5000", "", http.StatusForbidden},
		{"default: a forged header changes nothing", fault.Access{}, "10.0.0.7:5000", "Bearer anything", http.StatusForbidden},
		{"token: right, from anywhere", fault.Access{Token: "s3cret"}, "10.0.0.7:5000", "Bearer s3cret", http.StatusTeapot},
		{"token: wrong", fault.Access{Token: "s3cret"}, "10.0.0.7:5000", "Bearer s3cre", http.StatusUnauthorized},
		{"token: missing, even on loopback", fault.Access{Token: "s3cret"}, "127.0.0.1:5000", "", http.StatusUnauthorized},
		{"open: anyone", fault.Access{Open: true}, "10.0.0.7:5000", "", http.StatusTeapot},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/v1/faults", nil)
		r.RemoteAddr = tt.remote
		if tt.auth != "" {
			r.Header.Set("Authorization", tt.auth)
		}
		w := httptest.NewRecorder()
		tt.access.Guard(ok)(w, r)
		if w.Code != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, w.Code, tt.want)
		}
	}
}
