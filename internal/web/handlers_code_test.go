package web

import (
	"testing"

	"github.com/idemlab/idemlab"
)

// The identities' code links name lines by what they say; an edit that
// changes such a line must change the reference too.
func TestIdentityCodeRefsFindTheirLines(t *testing.T) {
	for _, r := range []codeRef{codeKeyClaim, codeBusinessClaim, codeStepKey} {
		if idemlab.LineOf(r.Path, r.Text) == 0 {
			t.Errorf("no line of %s says %q", r.Path, r.Text)
		}
	}
}

func TestCodePathRefusesWhatIsNotInTheTree(t *testing.T) {
	for raw, want := range map[string]string{
		"":                          ".",
		"internal/":                 "internal",
		"internal/workflow/run.go":  "internal/workflow/run.go",
		"internal%2Fworkflow":       "internal/workflow",
		"../etc/passwd":             "",
		"internal/../../etc/passwd": "",
		"%2e%2e/go.mod":             "",
		"/etc/passwd":               "",
		"internal//workflow":        "",
		"internal/./workflow":       "",
		"a\\b":                      "",
		"a%00b":                     "",
		"%zz":                       "",
	} {
		got, err := codePath(raw)
		if want == "" {
			if err == nil {
				t.Errorf("codePath(%q) = %q, want a refusal", raw, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("codePath(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}
