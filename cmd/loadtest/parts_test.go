package main

import (
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%g = %s, want %s", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 99) != 0 {
		t.Error("percentile of nothing is not 0")
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// The client-side check of one key's answers: in-flight refusals and 5xx
// decide nothing; differing answers and a second execution are anomalies.
func TestCheckOneAnswer(t *testing.T) {
	ok := answer{status: 200, body: []byte(`{"id":1}`)}
	replay := answer{status: 200, body: []byte(`{"id":1}`), replayed: true}
	inFlight := answer{status: http.StatusConflict, problem: "request-in-progress"}
	for _, tc := range []struct {
		name      string
		answers   []answer
		anomalies int64
	}{
		{"one execution, replays", []answer{ok, replay, replay}, 0},
		{"in flight, then the replay", []answer{inFlight, ok, replay}, 0},
		{"a 500 decides nothing", []answer{{status: 500}, ok}, 0},
		{"two executions", []answer{ok, ok}, 1},
		{"a replay that differs", []answer{ok, {status: 200, body: []byte(`{"id":2}`), replayed: true}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &worker{rec: newRecorder(), rng: rand.New(rand.NewPCG(1, 1))}
			got := w.checkOneAnswer(request{key: "k"}, tc.answers)
			if w.rec.nAnomaly != tc.anomalies {
				t.Errorf("anomalies %d, want %d: %v", w.rec.nAnomaly, tc.anomalies, w.rec.anomalies)
			}
			if got.status != 200 {
				t.Errorf("decisive answer %s, want 200", got.label())
			}
		})
	}
}

func TestBadFlagsAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "nope"},
		{"-concurrency", "0"},
		{"-url", "localhost:8080"},
		{"-duration", "0s"},
		{"-warmup", "-1s"},
		{"extra"},
	} {
		_, err := parseConfig(args, io.Discard)
		var u usageError
		if !asUsage(err, &u) {
			t.Errorf("%v: err %v, want a usage error", args, err)
		}
	}
	cfg, err := parseConfig([]string{"-url", "http://127.0.0.1:9/"}, io.Discard)
	if err != nil || cfg.URL != "http://127.0.0.1:9" || cfg.Scenario != "mixed" {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

func asUsage(err error, u *usageError) bool {
	if e, ok := err.(usageError); ok {
		*u = e
		return true
	}
	return false
}

func TestEveryScenarioIsDocumented(t *testing.T) {
	for _, name := range scenarioNames() {
		if sc := scenarios[name]; sc.about == "" || len(sc.intents) == 0 || strings.TrimSpace(name) == "" {
			t.Errorf("scenario %q lacks an about line or intents", name)
		}
	}
}
