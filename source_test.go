package idemlab

import (
	"io/fs"
	"strings"
	"testing"
)

func TestFuncLineFindsDeclarations(t *testing.T) {
	for _, tc := range []struct {
		path, name string
		want       string // the line's start
	}{
		{"internal/workflow/run.go", "recordEvent", "func recordEvent("},
		{"internal/workflow/writer.go", "writerOf", "func writerOf("},
		{"internal/workflow/run.go", "(*runner).succeed", "func (r *runner) succeed("},
		{"internal/workflow/claim.go", "(*Engine).claimSkipLocked", "func (e *Engine) claimSkipLocked("},
		{"internal/workflow/claim.go", "claimed.claim", "func (c claimed) claim("}, // a value receiver, as the runtime names it
		{"internal/workflow/claim.go", "(*claimed).claim", ""},
		{"internal/workflow/run.go", "(*runner).nothing", ""},
		{"internal/workflow/nope.go", "f", ""},
		{"internal/workflow/run.go", "(*runner", ""},
	} {
		line := FuncLine(tc.path, tc.name)
		if tc.want == "" {
			if line != 0 {
				t.Errorf("FuncLine(%q, %q) = %d, want 0", tc.path, tc.name, line)
			}
			continue
		}
		if line == 0 {
			t.Errorf("FuncLine(%q, %q) = 0", tc.path, tc.name)
			continue
		}
		if got := lineText(t, tc.path, line); len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("FuncLine(%q, %q) = %d: %q", tc.path, tc.name, line, got)
		}
	}
}

func lineText(t *testing.T, path string, n int) string {
	t.Helper()
	raw, err := fs.ReadFile(Source(), path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	if n < 1 || n > len(lines) {
		t.Fatalf("%s has no line %d", path, n)
	}
	return lines[n-1]
}
