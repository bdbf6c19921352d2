package report

import (
	"bytes"
	"cmp"
	"fmt"
	"html"
	"io"
	"slices"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/check"
	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// HTML writes the report page: the verdict, the figures, the timeline and
// every violation. It is one self-contained file.
func (s Summary) HTML(w io.Writer) error {
	var b bytes.Buffer
	e := html.EscapeString
	verdict, colour := "no violations", "#166534"
	if len(s.Violations) > 0 {
		verdict, colour = fmt.Sprintf("%d violations", len(s.Violations)), "#991b1b"
	}
	fmt.Fprintf(&b, `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>idemlab chaos run, seed %d</title>
<style>body{font-family:sans-serif;margin:2rem;max-width:1240px;color:#111827}
table{border-collapse:collapse;margin:1rem 0}td,th{border-bottom:1px solid #e5e7eb;padding:.25rem .75rem;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}code,pre{font-size:.85rem}pre{white-space:pre-wrap}
.verdict{font-size:1.3rem;font-weight:bold;color:%s}</style></head><body>`, s.Seed, colour)
	fmt.Fprintf(&b, `<h1>idemlab chaos run</h1><p class="verdict">%s</p>`, e(verdict))
	fmt.Fprintf(&b, `<p>Seed %d, started %s. Faults for %s, then heal; drained in %s.</p>`,
		s.Seed, s.Started.UTC().Format(time.RFC3339), s.Duration.Round(time.Second), s.Drain.Round(100*time.Millisecond))

	b.WriteString(`<h2>Timeline</h2>`)
	b.WriteString(s.SVG())

	b.WriteString(`<h2>Figures</h2><table>`)
	row := func(name string, n int, detail string) {
		fmt.Fprintf(&b, `<tr><th>%s</th><td class="n">%d</td><td>%s</td></tr>`, e(name), n, e(detail))
	}
	row("kills", s.KillsTotal(), fmt.Sprintf("%s; at crash points: %s", counts(s.Kills), orNone(counts(s.Crashes))))
	row("pauses (SIGSTOP 1–4 s)", s.Faults[history.Pause], "")
	row("network delay windows", s.DelayWindows(), fmt.Sprintf("%d of delay, %d of held calls", s.Faults[history.Delay], s.Faults[history.Hold]))
	row("database restarts", s.DBRestarts(), fmt.Sprintf("%d immediate, %d down for a while", s.Faults[history.DBRestart], s.Faults[history.DBDown]))
	row("fault flips", s.Faults[history.Flip], fmt.Sprintf("belief changes %d", s.Faults[history.Belief]))
	row("callback mode changes", s.Faults[history.Callbacks], fmt.Sprintf("%d reorders of the history consumer's deliveries", s.Faults[history.Reorder]))
	row("processes ending on their own", s.Faults[history.Exit], "")
	row("intents", sum(s.Intents), counts(s.Intents))
	row("requests", s.Requests, "")
	row("500s", s.Count500(), "")
	row("provider effects", s.Effects, fmt.Sprintf("%d policies more than once; %d late calls refused (Request-Deadline)", s.Doubled, s.Late))
	row("events", int(s.Events.Sent), s.EventsText())
	row("waiting for a person", s.Waiting, "")
	row("handed over to recovery", len(s.ClaimLags), "answer → claim: "+s.ClaimLagText())
	b.WriteString(`</table>`)

	b.WriteString(`<h2>Answers</h2>`)
	mapTable(&b, s.Answers)
	b.WriteString(`<h2>5xx by kind</h2>`)
	mapTable(&b, s.Kinds5xx)

	fmt.Fprintf(&b, `<h2>Violations (%d)</h2>`, len(s.Violations))
	if len(s.Violations) == 0 {
		b.WriteString(`<p>None.</p>`)
	}
	for _, group := range check.ByCheck(s.Violations) {
		fmt.Fprintf(&b, `<h3>%s: %d</h3><ul>`, e(group[0].Check), len(group))
		for i, v := range group {
			if i == 50 {
				fmt.Fprintf(&b, `<li>… and %d more (violations.json)</li>`, len(group)-50)
				break
			}
			fmt.Fprintf(&b, `<li><pre>%s</pre></li>`, e(v.Detail))
		}
		b.WriteString(`</ul>`)
	}
	if len(s.Notes) > 0 {
		b.WriteString(`<h2>Notes</h2><ul>`)
		for _, n := range s.Notes {
			fmt.Fprintf(&b, `<li>%s</li>`, e(n))
		}
		b.WriteString(`</ul>`)
	}
	b.WriteString(`<h2>Settings</h2><pre>`)
	for _, st := range s.Settings {
		b.WriteString(e(st) + "\n")
	}
	b.WriteString(`</pre></body></html>`)
	_, err := w.Write(b.Bytes())
	return err
}

func mapTable(b *bytes.Buffer, m map[string]int) {
	if len(m) == 0 {
		b.WriteString(`<p>None.</p>`)
		return
	}
	b.WriteString(`<table>`)
	for _, part := range splitCounts(m) {
		fmt.Fprintf(b, `<tr><td>%s</td><td class="n">%d</td></tr>`, html.EscapeString(part.k), part.v)
	}
	b.WriteString(`</table>`)
}

type kv struct {
	k string
	v int
}

// splitCounts lists a map largest first, then by name.
func splitCounts(m map[string]int) []kv {
	var out []kv
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	slices.SortFunc(out, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
	return out
}
