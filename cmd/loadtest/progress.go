package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// startProgress prints a live line to w once a second, rewritten in place
// with \r, until the returned stop is called (which prints it a last time
// and ends the line).
func startProgress(w io.Writer, rec *recorder, start time.Time, total time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := start
		for {
			select {
			case <-done:
				fmt.Fprintln(w, progressLine(rec.tick(), time.Since(start), total, time.Since(last)))
				return
			case now := <-t.C:
				fmt.Fprint(w, progressLine(rec.tick(), now.Sub(start), total, now.Sub(last)))
				last = now
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// progressLine: "\r  3s/10s  requests 4,210  1,402/s  p99 11.2ms  5xx 0  no answer 0  anomalies 0".
func progressLine(t tick, elapsed, total, since time.Duration) string {
	rate := 0.0
	if since > 0 {
		rate = float64(t.recent) / since.Seconds()
	}
	return fmt.Sprintf("\r  %s/%s  requests %s  %s/s  p99 %s  5xx %d  no answer %d  anomalies %d   ",
		elapsed.Truncate(time.Second), total, thousands(t.requests), thousands(int64(rate)),
		ms(t.recentP99), t.serverErr, t.noAnswer, t.anomalies)
}

// thousands writes n with thin separators: 12,345.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ms formats a latency in milliseconds with one decimal: 12.3ms.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
