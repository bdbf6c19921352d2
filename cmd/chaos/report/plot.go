package report

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// lanes are the fault rows of the plot, top to bottom, with their colours.
var lanes = []struct {
	kind, label, color string
}{
	{history.Kill, "kill", "#b91c1c"},
	{history.CrashKill, "crash point", "#7f1d1d"},
	{history.Pause, "pause", "#7c3aed"},
	{history.Delay, "net delay", "#0369a1"},
	{history.Hold, "held calls", "#0e7490"},
	{history.Flip, "fault flip", "#a16207"},
	{history.Belief, "belief", "#4d7c0f"},
	{history.Callbacks, "callback mode", "#6d28d9"},
	{history.Reorder, "event reorder", "#0f766e"},
	{history.DBRestart, "db restart", "#c2410c"},
	{history.DBDown, "db down", "#9a3412"},
	{history.Failover, "db failover", "#be123c"},
	{history.Exit, "exit (finding)", "#000000"},
}

// classes are the answer bands of the plot, bottom to top.
var classes = []struct {
	name, color string
	of          func(history.Attempt) bool
}{
	{"2xx", "#16a34a", func(a history.Attempt) bool { return a.Status/100 == 2 }},
	{"4xx final", "#2563eb", func(a history.Attempt) bool { return a.Status/100 == 4 && a.Final() }},
	{"409 in progress / 4xx retry", "#f59e0b", func(a history.Attempt) bool { return a.Status/100 == 4 && !a.Final() }},
	{"5xx (not 500)", "#f87171", func(a history.Attempt) bool { return a.Status > 500 }},
	{"500", "#7f1d1d", func(a history.Attempt) bool { return a.Status == 500 }},
	{"no answer", "#9ca3af", func(a history.Attempt) bool { return a.Status == 0 }},
}

// SVG draws the run's timeline: one lane per kind of fault above (a tick
// for an instant, a bar for a span), and below, the answers by class in
// stacked bars per time bucket, with the heal and the end of the drain
// marked across both.
func (s Summary) SVG() string {
	const (
		width   = 1200
		left    = 120
		right   = 20
		laneH   = 16
		laneGap = 3
		barsH   = 220
		gap     = 34
	)
	t0 := s.Started
	t1 := s.Drained
	if t1.IsZero() {
		t1 = s.Healed
	}
	for _, in := range s.intents {
		for _, a := range in.Attempts {
			if a.Done.After(t1) {
				t1 = a.Done
			}
		}
	}
	span := max(t1.Sub(t0), time.Second)
	plotW := float64(width - left - right)
	x := func(t time.Time) float64 { return left + plotW*float64(t.Sub(t0))/float64(span) }

	lanesH := len(lanes) * (laneH + laneGap)
	barsTop := 20 + lanesH + gap
	height := barsTop + barsH + 60

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="11">`, width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`, width, height)
	fmt.Fprintf(&b, `<text x="%d" y="13" font-weight="bold">Faults injected</text>`, left)

	// The fault lanes.
	for i, l := range lanes {
		y := 20 + i*(laneH+laneGap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="%s">%s</text>`, left-6, y+laneH-4, l.color, l.label)
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%d" fill="#f3f4f6"/>`, left, y, plotW, laneH)
		for _, f := range s.faults {
			if f.Kind != l.kind {
				continue
			}
			x0, x1 := x(f.Start), x(f.End)
			w := math.Max(x1-x0, 1.5)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" opacity="0.8"><title>%s</title></rect>`,
				x0, y, w, laneH, l.color, html.EscapeString(faultTitle(f, t0)))
		}
	}

	// The answers, bucketed.
	bucket := time.Second
	for span/bucket > 300 {
		bucket *= 2
	}
	n := int(span/bucket) + 1
	counts := make([][]int, n)
	for i := range counts {
		counts[i] = make([]int, len(classes))
	}
	for _, in := range s.intents {
		for _, a := range in.Attempts {
			i := int(a.Done.Sub(t0) / bucket)
			if i < 0 || i >= n {
				continue
			}
			for c, cl := range classes {
				if cl.of(a) {
					counts[i][c]++
					break
				}
			}
		}
	}
	peak := 1
	for _, row := range counts {
		total := 0
		for _, v := range row {
			total += v
		}
		peak = max(peak, total)
	}
	perSecond := float64(time.Second) / float64(bucket)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">Answers by status (per second, %s buckets)</text>`, left, barsTop-8, bucket)
	bw := plotW / float64(n)
	for i, row := range counts {
		yBase := float64(barsTop + barsH)
		for c, v := range row {
			if v == 0 {
				continue
			}
			h := float64(barsH) * float64(v) / float64(peak)
			yBase -= h
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"><title>%s: %.0f/s at %s</title></rect>`,
				left+float64(i)*bw, yBase, math.Max(bw-0.3, 0.5), h, classes[c].color, classes[c].name, float64(v)*perSecond, (time.Duration(i) * bucket).String())
		}
	}
	// The y axis: the peak, per second.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#374151"/>`, left, barsTop, left, barsTop+barsH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%.0f/s</text>`, left-6, barsTop+8, float64(peak)*perSecond)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">0</text>`, left-6, barsTop+barsH)

	// The time axis.
	axisY := barsTop + barsH
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%.0f" y2="%d" stroke="#374151"/>`, left, axisY, left+plotW, axisY)
	step := tickStep(span)
	for t := time.Duration(0); t <= span; t += step {
		xt := x(t0.Add(t))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#374151"/>`, xt, axisY, xt, axisY+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, xt, axisY+16, t)
	}

	// Heal and drained, across everything.
	for _, m := range []struct {
		at    time.Time
		label string
	}{{s.Healed, "heal"}, {s.Drained, "drained"}} {
		if m.at.IsZero() {
			continue
		}
		xm := x(m.at)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="16" x2="%.1f" y2="%d" stroke="#111827" stroke-dasharray="4 3"/>`, xm, xm, axisY)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>`, xm, axisY+30, m.label)
	}

	// The legend.
	lx := left
	for _, cl := range classes {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`, lx, height-16, cl.color, lx+14, height-7, cl.name)
		lx += 30 + 7*len(cl.name)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func faultTitle(f history.Fault, t0 time.Time) string {
	at := f.Start.Sub(t0).Round(10 * time.Millisecond)
	s := fmt.Sprintf("%s %s at %s", f.Kind, f.Target, at)
	if f.End.After(f.Start) {
		s += fmt.Sprintf(" for %s", f.End.Sub(f.Start).Round(10*time.Millisecond))
	}
	if f.Detail != "" {
		s += ": " + f.Detail
	}
	return s
}

// tickStep picks a round step giving at most about twelve ticks.
func tickStep(span time.Duration) time.Duration {
	for _, s := range []time.Duration{5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute} {
		if span/s <= 12 {
			return s
		}
	}
	return time.Hour
}
