package idemlab_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// markdownLink is [text](target) where target is not a URL with a scheme.
var markdownLink = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)

// Every relative link in the README and the docs names a file that exists:
// a reference people study must not send them to a page that was renamed.
func TestDocumentLinksPointAtFilesThatExist(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append([]string{"README.md", "SECURITY.md"}, docs...) {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path := filepath.Join(filepath.Dir(doc), target)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", doc, target)
			}
		}
	}
}

// section is the part of the README under heading (## or ###) up to the
// next heading of any level.
func section(t *testing.T, readme, heading string) string {
	t.Helper()
	start := strings.Index(readme, heading+"\n")
	if start < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	rest := readme[start+len(heading)+1:]
	if end := regexp.MustCompile(`(?m)^#{2,3} `).FindStringIndex(rest); end != nil {
		rest = rest[:end[0]]
	}
	return rest
}

// The reading path stays short and its figures true: "How to read this
// code" follows one cancellation through at most eight files, and every
// "(N lines)" in the README is within a tenth of the file's length today.
func TestReadingPathIsShortAndItsCountsTrue(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	step := regexp.MustCompile("(?m)^\\d+\\. \\[`([^`]+)`\\]")
	files := map[string]bool{}
	for _, m := range step.FindAllStringSubmatch(section(t, readme, "## How to read this code"), -1) {
		files[m[1]] = true
	}
	if len(files) == 0 || len(files) > 8 {
		t.Errorf("How to read this code follows a cancellation through %d files, want 1 to 8", len(files))
	}
	counted := regexp.MustCompile(`\]\(([^)#\s]+)\) \((\d+) lines\)`)
	for _, m := range counted.FindAllStringSubmatch(readme, -1) {
		b, err := os.ReadFile(m[1])
		if err != nil {
			t.Errorf("README counts the lines of %s: %v", m[1], err)
			continue
		}
		have := strings.Count(string(b), "\n")
		said, _ := strconv.Atoi(m[2])
		if d := said - have; d*10 > have || -d*10 > have {
			t.Errorf("README says %s has %d lines; it has %d", m[1], said, have)
		}
	}
}

// Every link into schema.sql lands on the line that defines what it names
// (`make generate` points them; this fails when a migration moved them).
func TestSchemaLinksLandOnTheirLines(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile("migrations/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(schema), "\n")
	link := regexp.MustCompile("\\[`(\\w+)`\\]\\(migrations/schema\\.sql#L(\\d+)\\)")
	ms := link.FindAllStringSubmatch(string(raw), -1)
	if len(ms) < 5 {
		t.Fatalf("README links %d constraints in schema.sql, want each idea's", len(ms))
	}
	for _, m := range ms {
		n, _ := strconv.Atoi(m[2])
		if n < 1 || n > len(lines) || !regexp.MustCompile(`(CONSTRAINT|INDEX) `+m[1]+` `).MatchString(lines[n-1]) {
			t.Errorf("README links %s to schema.sql line %d, which does not define it: run 'make generate'", m[1], n)
		}
	}
}
