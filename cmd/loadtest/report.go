package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// report is the end of a run: the figures and the verdict. Its JSON form
// (-json) is what scripts/bench reads.
type report struct {
	Scenario    string  `json:"scenario"`
	URL         string  `json:"url"`
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate,omitempty"`
	Seed        uint64  `json:"seed"`
	Seconds     float64 `json:"seconds"`
	Warmup      float64 `json:"warmup_seconds,omitempty"` // driven before Seconds, not in the figures
	Exhausted   bool    `json:"exhausted"`                // stopped early: no ACTIVE policy left

	Requests   int64            `json:"requests"`
	Throughput float64          `json:"throughput"` // answered requests per second
	LatencyMS  latencies        `json:"latency_ms"`
	Answers    map[string]int64 `json:"answers"`
	Keys       int64            `json:"keys"`

	ServerErrors int64    `json:"server_errors"` // 5xx
	NoAnswer     int64    `json:"no_answer"`
	Anomalies    int64    `json:"anomalies"`
	AnomalyList  []string `json:"anomaly_list"`

	SettleSeconds float64 `json:"settle_seconds"`
	LiveAfter     int64   `json:"live_after_settle"` // operations still IN_PROGRESS or RECOVERING
	Invariants    verdict `json:"invariants"`
	Cost          *cost   `json:"cost,omitempty"` // per 2xx answer, with -cost-pids

	Pass     bool     `json:"pass"`
	Failures []string `json:"failures"`

	dataset string
	about   string
}

type latencies struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func newReport(cfg config, sc *scenario, d *dataset, rec *recorder, res driveResult) report {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	lat := slices.Clone(rec.latencies)
	slices.Sort(lat)
	msf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	r := report{
		Scenario: cfg.Scenario, URL: cfg.URL, Concurrency: cfg.Concurrency, Rate: cfg.Rate, Seed: cfg.Seed,
		Seconds: res.elapsed.Seconds(), Warmup: cfg.Warmup.Seconds(), Exhausted: res.exhausted,
		Requests:      rec.requests,
		Throughput:    float64(len(lat)) / res.elapsed.Seconds(),
		Answers:       rec.answers,
		Keys:          rec.keys,
		ServerErrors:  rec.serverErr,
		NoAnswer:      rec.noAnswer,
		Anomalies:     rec.nAnomaly,
		AnomalyList:   slices.Clone(rec.anomalies),
		SettleSeconds: res.settle.waited.Seconds(),
		LiveAfter:     res.settle.live,
		Invariants:    res.verdict,
		Cost:          res.cost,
		Failures:      []string{},
		dataset:       fmt.Sprintf("%d customers, %d ACTIVE policies, %d slots", len(d.customers), len(d.policies), len(d.slots)),
		about:         sc.about,
	}
	if len(lat) > 0 {
		r.LatencyMS = latencies{P50: msf(percentile(lat, 50)), P95: msf(percentile(lat, 95)), P99: msf(percentile(lat, 99)), Max: msf(lat[len(lat)-1])}
	}
	// What fails a run, and why each is a failure (docs/performance.md).
	if !r.Invariants.OK {
		r.Failures = append(r.Failures, fmt.Sprintf("%d invariant violation(s)", len(r.Invariants.Violations)))
	}
	if r.ServerErrors > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d answer(s) 5xx: a 500 is a bug, whatever the load", r.ServerErrors))
	}
	if r.NoAnswer > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d request(s) got no answer", r.NoAnswer))
	}
	if r.Anomalies > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d anomaly(ies) seen by the client", r.Anomalies))
	}
	if n := r.Answers["429 rate-limited"]; n > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d answer(s) 429 rate-limited: the app limits this host's writes; "+
			"start it with RATE_LIMIT_EXEMPT=<this host's address> (docs/api.md \"Rate limits\")", n))
	}
	if r.LiveAfter > 0 {
		r.Failures = append(r.Failures, fmt.Sprintf("%d operation(s) still live %s after the run: recovery did not drain (does the app run its recovery loop?)",
			r.LiveAfter, res.settle.waited.Round(time.Second)))
	}
	r.Pass = len(r.Failures) == 0
	return r
}

func (r report) print(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("scenario    %s — %s", r.Scenario, r.about)
	rate := ""
	if r.Rate > 0 {
		rate = fmt.Sprintf(", at most %g/s", r.Rate)
	}
	p("target      %s, %d clients%s, seed %d", r.URL, r.Concurrency, rate, r.Seed)
	p("dataset     %s", r.dataset)
	p("")
	stopped := ""
	if r.Exhausted {
		stopped = "  (stopped early: every ACTIVE policy was used; raise -users or -policies-per-user)"
	}
	if r.Warmup > 0 {
		stopped += fmt.Sprintf("  (after %.0fs of warm-up, not counted)", r.Warmup)
	}
	p("requests    %s in %.1fs, %s/s, %s keys%s", thousands(r.Requests), r.Seconds, thousands(int64(r.Throughput)), thousands(r.Keys), stopped)
	p("latency     p50 %.1fms  p95 %.1fms  p99 %.1fms  max %.1fms", r.LatencyMS.P50, r.LatencyMS.P95, r.LatencyMS.P99, r.LatencyMS.Max)
	if c := r.Cost; c != nil {
		names := slices.Sorted(maps.Keys(c.CPUms))
		cpu := make([]string, len(names))
		for i, n := range names {
			cpu[i] = fmt.Sprintf("%s %.2fms", n, c.CPUms[n])
		}
		p("cost        per 2xx answer (%s): CPU %s · buffers %.0f · WAL %.1f records, %.0f bytes",
			thousands(c.Ops), strings.Join(cpu, ", "), c.Buffers, c.WALRecords, c.WALBytes)
	}
	p("")
	p("answers")
	labels := make([]string, 0, len(r.Answers))
	for l := range r.Answers {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	for _, l := range labels {
		p("  %-32s %10s", l, thousands(r.Answers[l]))
	}
	p("")
	p("client      %d anomalies (answers for one key that disagree, a key executed twice, two wins for one intent)", r.Anomalies)
	for _, a := range r.AnomalyList {
		p("  %s", a)
	}
	c := r.Invariants.Counts
	p("settle      %.1fs, %d operations still live", r.SettleSeconds, r.LiveAfter)
	p("counts      operations %s · bookings %d (%d confirmed) · provider effects %d · keys completed %d, in progress %d",
		byStatus(c.OperationsByStatus), c.Bookings, c.ConfirmedBookings, c.Effects, c.KeysCompleted, c.KeysInProgress)
	if r.Invariants.OK {
		p("invariants  ok")
	} else {
		p("invariants  VIOLATED")
		for _, v := range r.Invariants.Violations {
			p("  %d: %s (ids %v)", v.Invariant, v.Detail, v.IDs)
		}
	}
	p("")
	if r.Pass {
		p("PASS")
		return
	}
	p("FAIL: %s", strings.Join(r.Failures, "; "))
}

func byStatus(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
