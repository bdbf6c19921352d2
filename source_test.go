package idemlab

import (
	"io/fs"
	"strings"
	"testing"
)

func TestDeclLineFindsDeclarations(t *testing.T) {
	for _, tc := range []struct {
		dir, name string
		want      string // the line's start
	}{
		{"internal/workflow", "sqlStepSent", "const sqlStepSent ="},
		{"internal/workflow", "sqlClaimSkipLocked", "var sqlClaimSkipLocked ="},
		{"internal/workflow", "sqlStep", ""}, // a prefix of names is not a name
		{"internal/workflow", "nothing", ""},
		{"internal/nope", "sqlStepSent", ""},
	} {
		path, line := DeclLine(tc.dir, tc.name)
		if tc.want == "" {
			if line != 0 {
				t.Errorf("DeclLine(%q, %q) = %s:%d, want none", tc.dir, tc.name, path, line)
			}
			continue
		}
		if line == 0 {
			t.Errorf("DeclLine(%q, %q): not found", tc.dir, tc.name)
			continue
		}
		if got := lineText(t, path, line); !strings.HasPrefix(got, tc.want) {
			t.Errorf("DeclLine(%q, %q) = %s:%d: %q", tc.dir, tc.name, path, line, got)
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
