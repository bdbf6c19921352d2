package main

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// recorder collects every answer of the workload: latencies, answers by
// label, and what the client itself saw go wrong (anomalies). Safe for
// concurrent use.
type recorder struct {
	mu        sync.Mutex
	latencies []time.Duration // every answered request, for the percentiles
	window    []time.Duration // since the last progress line
	answers   map[string]int64
	requests  int64
	serverErr int64 // 5xx
	noAnswer  int64 // transport errors
	anomalies []string
	nAnomaly  int64
	keys      int64 // idempotency keys the workload minted
}

// maxListedAnomalies bounds the report; the count is always exact.
const maxListedAnomalies = 10

func newRecorder() *recorder { return &recorder{answers: map[string]int64{}} }

// startMeasuring ends a warm-up: the answers and latencies so far are
// forgotten, so the figures are of the measured run alone. What broke
// stays — a 5xx, a request with no answer or an anomaly in the warm-up
// fails the run as much as one later.
func (r *recorder) startMeasuring() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latencies, r.window = nil, nil
	r.answers = map[string]int64{}
	r.requests = 0
}

// answered2xx is how many answers so far were a success (2xx): the
// operations a cost is divided by.
func (r *recorder) answered2xx() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for label, count := range r.answers {
		if strings.HasPrefix(label, "2") {
			n += count
		}
	}
	return n
}

func (r *recorder) record(a answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.answers[a.label()]++
	switch {
	case a.err != nil:
		r.noAnswer++
	case a.status >= 500:
		r.serverErr++
	}
	if a.err == nil {
		r.latencies = append(r.latencies, a.latency)
		r.window = append(r.window, a.latency)
	}
}

// anomaly records something the client saw that must not happen: two
// answers for one key that disagree, two executions of one key, two wins
// for one intent.
func (r *recorder) anomaly(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nAnomaly++
	if len(r.anomalies) < maxListedAnomalies {
		r.anomalies = append(r.anomalies, what)
	}
}

func (r *recorder) mintedKeys(n int) {
	r.mu.Lock()
	r.keys += int64(n)
	r.mu.Unlock()
}

// tick is what the progress line shows: totals, and the requests and p99
// since the previous tick.
type tick struct {
	requests, serverErr, noAnswer, anomalies int64
	recent                                   int
	recentP99                                time.Duration
}

func (r *recorder) tick() tick {
	r.mu.Lock()
	w := r.window
	r.window = make([]time.Duration, 0, len(w))
	t := tick{requests: r.requests, serverErr: r.serverErr, noAnswer: r.noAnswer, anomalies: r.nAnomaly, recent: len(w)}
	r.mu.Unlock()
	slices.Sort(w)
	t.recentP99 = percentile(w, 99)
	return t
}

// percentile of sorted durations, nearest rank; 0 for none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}
