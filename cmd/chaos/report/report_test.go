package report

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/check"
	"github.com/idemlab/idemlab/cmd/chaos/history"
)

func sample() Summary {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	log := history.NewLog(7)
	log.Started, log.Healed, log.Drained = t0, t0.Add(60*time.Second), t0.Add(64*time.Second)
	intents := []history.Intent{{Kind: history.Cancel, Attempts: []history.Attempt{
		{Done: t0.Add(time.Second), Status: 500, Problem: "internal"},
		{Done: t0.Add(2 * time.Second), Err: "timeout"},
		{Done: t0.Add(3 * time.Second), Status: 409, Problem: "request-in-progress"},
		{Done: t0.Add(4 * time.Second), Status: 200},
	}}, {Kind: history.Cancel, Attempts: []history.Attempt{
		{Done: t0.Add(5 * time.Second), Status: 202, Body: []byte(`{"id":5,"status":"IN_PROGRESS"}`)},
	}}}
	faults := []history.Fault{
		{Kind: history.Kill, Target: "app-1", Start: t0.Add(time.Second), End: t0.Add(time.Second)},
		{Kind: history.CrashKill, Target: "app-2", Start: t0.Add(2 * time.Second), End: t0.Add(2 * time.Second), Detail: "after_claim"},
		{Kind: history.Pause, Target: "app-1", Start: t0.Add(5 * time.Second), End: t0.Add(8 * time.Second)},
		{Kind: history.DBRestart, Target: "postgres", Start: t0.Add(9 * time.Second), End: t0.Add(11 * time.Second), Detail: `<&"quoted">`},
		{Kind: history.Hold, Target: "provider", Start: t0.Add(12 * time.Second), End: t0.Add(14 * time.Second)},
	}
	end := check.EndState{Effects: map[int64]int{1: 1, 2: 2},
		Operations: map[int64]check.Operation{5: {ID: 5, Claimed: t0.Add(5*time.Second + 300*time.Millisecond)}}}
	vs := []check.Violation{{Check: "no-500", Detail: "cancel: answered 500 <on app-1>"}}
	return Summarize(log, intents, faults, end, map[string]int{"500 internal": 1}, vs, []string{"seed=7"})
}

func TestTheTimelineIsWellFormedSVG(t *testing.T) {
	svg := sample().SVG()
	d := xml.NewDecoder(strings.NewReader(svg))
	rects := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	for _, want := range []string{"crash point", "db restart", "heal", "drained", "after_claim", "&lt;&amp;&#34;quoted&#34;&gt;", "500"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}
	if rects < 20 {
		t.Errorf("only %d rects: lanes, faults and answer bars are missing", rects)
	}
}

func TestTheFiguresCountWhatHappened(t *testing.T) {
	s := sample()
	if s.KillsTotal() != 2 || s.DBRestarts() != 1 || s.DelayWindows() != 1 || s.Count500() != 1 || s.Requests != 5 || s.Effects != 3 || s.Doubled != 1 {
		t.Fatalf("figures: kills %d db %d delays %d 500s %d requests %d effects %d doubled %d",
			s.KillsTotal(), s.DBRestarts(), s.DelayWindows(), s.Count500(), s.Requests, s.Effects, s.Doubled)
	}
	if len(s.ClaimLags) != 1 || s.ClaimLags[0] != 300*time.Millisecond {
		t.Fatalf("claim lags %v, want the one hand-over claimed after 300ms", s.ClaimLags)
	}
	if s.Drain != 4*time.Second || s.Duration != time.Minute {
		t.Fatalf("duration %s drain %s", s.Duration, s.Drain)
	}
	var text bytes.Buffer
	s.Text(&text)
	for _, want := range []string{"kills           2", "after_claim 1", "500s            1", "violations: 1", "no-500"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the text summary lacks %q:\n%s", want, text.String())
		}
	}
	var page bytes.Buffer
	if err := s.HTML(&page); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "<svg") || !strings.Contains(page.String(), "answered 500 &lt;on app-1&gt;") {
		t.Error("the HTML page lacks the plot or the escaped violation")
	}
}
