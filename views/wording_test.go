package views

import (
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/labs"
)

// pageSources are the files whose text reaches a page: the templates, the
// labs' lessons and the web layer's messages.
func pageSources(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{"views", "internal/labs", "internal/web"} {
		entries, err := fs.ReadDir(idemlab.Source(), dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasSuffix(name, "_test.go") || strings.HasSuffix(name, "_templ.go") ||
				(path.Ext(name) != ".templ" && path.Ext(name) != ".go") {
				continue
			}
			raw, err := fs.ReadFile(idemlab.Source(), dir+"/"+name)
			if err != nil {
				t.Fatal(err)
			}
			out[dir+"/"+name] = string(raw)
		}
	}
	return out
}

// modeMentions are the ways a page tells a reader to set a fault: "set the
// provider to lost_response", "pick lost_response here".
var modeMentions = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\b(?:provider|payments)(?: service)? to (?:<code>)?([a-z_]+)`),
	regexp.MustCompile(`(?i)\bpick (?:<code>)?([a-z]+_[a-z_]+)`),
	regexp.MustCompile(`(?i)\bset (?:it )?to (?:<code>)?([a-z]+_[a-z_]+)`),
}

// A page that sends a reader to the Provider page for a fault mode names
// one the page offers (issue 29: "set the provider to timeout" named none).
func TestPagesNameOnlyFaultModesTheProviderPageOffers(t *testing.T) {
	seen := 0
	for file, src := range pageSources(t) {
		for _, re := range modeMentions {
			for _, m := range re.FindAllStringSubmatch(src, -1) {
				seen++
				if !slices.Contains(FaultModes, m[1]) {
					t.Errorf("%s: %q names %q, which is not a mode the Provider page offers (%v)", file, m[0], m[1], FaultModes)
				}
			}
		}
	}
	if seen < 3 {
		t.Fatalf("found %d mentions of a mode: the patterns no longer match the pages", seen)
	}
}

var quoted = regexp.MustCompile(`“([^”]+)”`)

// A lab's "try this" names only counts its result table shows, and a lab
// whose table has no count to keep at zero is not described as a broken
// and a correct variant side by side.
func TestLabTryNamesOnlyColumnsItsTableShows(t *testing.T) {
	for _, l := range labs.All() {
		info := LabInfo{Name: l.Name, Try: l.Try}
		bad := 0
		for _, c := range l.Columns {
			info.Columns = append(info.Columns, LabColumn{Label: c.Label, Bad: c.Bad})
			if c.Bad {
				bad++
			}
		}
		try := labTry(info)
		for _, m := range quoted.FindAllStringSubmatch(try, -1) {
			if !slices.ContainsFunc(info.Columns, func(c LabColumn) bool { return c.Label == m[1] }) {
				t.Errorf("lab %s: try names %q, which its table does not show: %s", l.Name, m[1], try)
			}
		}
		if bad > 0 && len(quoted.FindAllString(try, -1)) != bad {
			t.Errorf("lab %s: try names %d counts, its table has %d that should be zero: %s", l.Name, len(quoted.FindAllString(try, -1)), bad, try)
		}
		if what := labWhat(info); bad == 0 && strings.Contains(what, "correction") {
			t.Errorf("lab %s has no broken variant, yet says %q", l.Name, what)
		}
	}
}

var docMention = regexp.MustCompile(`docs/[a-z-]+\.md|\bthe README\b`)

// Every mention of a doc on a page is a link (DocLink): a reader in a
// browser can open it.
func TestEveryDocMentionIsALink(t *testing.T) {
	for file, src := range pageSources(t) {
		if path.Ext(file) != ".templ" {
			continue
		}
		for i, line := range strings.Split(src, "\n") {
			line, _, _ = strings.Cut(line, " // ") // a Go comment in a struct or a script
			trimmed := strings.TrimSpace(line)
			if strings.HasPrefix(trimmed, "//") {
				continue
			}
			for _, loc := range docMention.FindAllStringIndex(line, -1) {
				before := line[:loc[0]]
				if !strings.HasSuffix(before, `@DocLink("`) && !strings.Contains(before[max(0, len(before)-40):], "@DocLink(") {
					t.Errorf("%s:%d mentions %q without a link: %s", file, i+1, line[loc[0]:loc[1]], trimmed)
				}
			}
		}
	}
}

// Counts read as words (issue 29, finding 25: "1 effects", "three
// identities" above four).
func TestPluralReads(t *testing.T) {
	for n, want := range map[int]string{1: "1 identity", 4: "4 identities"} {
		if got := plural(n, "identity"); got != want {
			t.Errorf("plural(%d, identity) = %q", n, got)
		}
	}
	if got := plural(2, "day"); got != "2 days" {
		t.Errorf("plural(2, day) = %q", got)
	}
}

// The Events page explains why "published" may come after "applied", and a
// lab run's number says it counts across every lab (issue 29, finding 11).
func TestEventsAndLabRunsExplainTheirOrderAndNumbers(t *testing.T) {
	var out strings.Builder
	if err := EventsPage(Page{}, EventsView{Admin: true, ReplayKey: func() string { return "k" }}).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "after the broker&#39;s acknowledgement") && !strings.Contains(out.String(), "after the broker's acknowledgement") {
		t.Errorf("the Events page does not say when published is written")
	}
	out.Reset()
	if err := labRunResult(LabInfo{}, LabRunView{ID: 12}).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Run #12") || !strings.Contains(out.String(), "numbered across all labs") {
		t.Errorf("a lab run's number does not say what it counts: %s", out.String())
	}
}

var (
	barLink  = regexp.MustCompile(`data-testid="demo-controls"[^>]*>([^<]+)</a>`)
	demoName = regexp.MustCompile(`<h1>([^<]+)</h1>`)
)

// The pages send an admin to "Demo controls" (Recovery, the crash page, the
// demo page itself): the bar's link there carries that name (issue 29's
// second read: it read "Reset the demo data", and no link said "Demo
// controls").
func TestTheBarNamesDemoControlsAsThePagesDo(t *testing.T) {
	src := pageSources(t)
	link := barLink.FindStringSubmatch(src["views/layout.templ"])
	title := demoName.FindStringSubmatch(src["views/demo.templ"])
	if link == nil || title == nil {
		t.Fatal("the bar's link or the demo page's title is not where this test looks")
	}
	if link[1] != title[1] {
		t.Errorf("the bar's link reads %q, the page it opens is %q", link[1], title[1])
	}
	for file, s := range src {
		if (strings.Contains(s, "on Demo controls") || strings.Contains(s, "from Demo controls")) && title[1] != "Demo controls" {
			t.Errorf("%s sends a reader to Demo controls; the page is called %q", file, title[1])
		}
	}
}

var definite503 = regexp.MustCompile(`(?i)definite[^.\n]{0,80}\b503\b|\b503\b[^.\n]{0,80}\bdefinite`)

// A 503 from another system is an unknown outcome (the Provider and
// Payments pages' tables: "error → unknown 503", recovery asks): no page
// calls it a definite failure (issue 29's second read: the Retry column
// did).
func TestNoPageCallsA503Definite(t *testing.T) {
	for file, src := range pageSources(t) {
		if m := definite503.FindString(src); m != "" {
			t.Errorf("%s calls a 503 definite: %q", file, m)
		}
	}
}

var snake = regexp.MustCompile(`\b[a-z]+(?:_[a-z]+)+\b`)

// The Events page's "Try this" names injector modes the injector offers,
// and does not promise that deliver_twice shows an event "arrive twice" at
// a consumer: on a relayed transport it doubles the publish, and the
// broker's dedupe drops it first (issue 29's second read: the page said
// so, and every inbox showed 0).
func TestEventsTryNamesInjectorModesAndWhatTheyShow(t *testing.T) {
	src := pageSources(t)["views/events.templ"]
	i := strings.Index(src, "@Intro(")
	if i < 0 {
		t.Fatal("no intro on the Events page")
	}
	intro := src[i : i+strings.Index(src[i:], "\")\n")]
	names := snake.FindAllString(intro, -1)
	if len(names) == 0 {
		t.Fatal("the Events page's intro names no injector mode")
	}
	for _, n := range names {
		if !slices.Contains(events.Modes, events.Mode(n)) {
			t.Errorf("the Events page's intro names %q, which the injector does not offer (%v)", n, events.Modes)
		}
	}
	if strings.Contains(intro, "arrive twice") {
		t.Errorf("the Events page's intro promises an event arrives twice: %s", intro)
	}
}

var countedPlural = regexp.MustCompile(`%d (?:[A-Z]+ )?(?:confirmed )?(?:rows|bookings|refunds|effects|messages|events|attempts)\b`)

// A count printed with %d before a plural noun reads "1 refunds" when it is
// one (issue 29's second read: "1 PENDING rows", "1 confirmed bookings",
// "1 refunds of no charge"): such counts go through plural().
func TestCountsBeforeANounArePlural(t *testing.T) {
	for file, src := range pageSources(t) {
		for _, m := range countedPlural.FindAllString(src, -1) {
			t.Errorf("%s prints %q: one reads wrong; use plural()", file, m)
		}
	}
}

// The pages say what recovery does with each truth as recovery.go does it
// (the fresh reader's finding 3: the Provider and Payments pages said a
// RUNNING call is retried "only if idempotent", docs/recovery.md "whatever
// the belief"; the retry-is-not-recovery page said a resend is only ever
// earned by asking, while a system believed idempotent that cannot be asked
// is sent the same call again). RUNNING never leads to a resend; the
// belief decides only when the system cannot be asked.
func TestPagesSayWhatRecoveryDoesWithEachTruth(t *testing.T) {
	for name, src := range pageSources(t) {
		if strings.Contains(src, "then retry only if idempotent") || strings.Contains(src, "That resend is the one retry") {
			t.Errorf("%s says a resend recovery does not make, or hides one it does", name)
		}
	}
	ideas := pageSources(t)["views/ideas.templ"]
	if !strings.Contains(ideas, "whatever the belief") || !strings.Contains(ideas, "only if it is believed") {
		t.Errorf("the retry-is-not-recovery page does not say when the belief decides a resend")
	}
}

// Before a run, a lab's page promises what the run shows: the timeout lab,
// with no broken variant, does not promise "the broken and the correct
// variant" (the fresh reader's finding 20).
func TestALabPromisesOnlyWhatItRuns(t *testing.T) {
	for _, l := range labs.All() {
		info := LabInfo{}
		for _, c := range l.Columns {
			info.Columns = append(info.Columns, LabColumn{Label: c.Label, Bad: c.Bad})
		}
		if said := labNoRun(info); (l.Name == "timeouts") == strings.Contains(said, "broken") {
			t.Errorf("%s: %q", l.Name, said)
		}
	}
}
