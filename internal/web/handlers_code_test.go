package web

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/internal/testdb"
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

// A newcomer's first guesses at the code viewer lead somewhere (issue 29,
// finding 25): /code to its top folder, as /docs to the docs, and the
// README — what the viewer's readers want first — opens in it.
func TestTheCodeViewerOpensAtItsTopAndShowsTheREADME(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	app := New(Config{BodyLimit: "1M"}, Deps{
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pool:     db.Pool,
		Registry: prometheus.NewRegistry(),
	})
	e := app.routes()
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	if r := get("/code"); r.Code != http.StatusMovedPermanently || r.Header().Get("Location") != "/code/" {
		t.Errorf("GET /code: %d to %q, want 301 to /code/", r.Code, r.Header().Get("Location"))
	}
	if r := get("/code/"); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), "README.md") {
		t.Errorf("GET /code/: %d, the top folder listing README.md: %v", r.Code, strings.Contains(r.Body.String(), "README.md"))
	}
	if r := get("/code/README.md"); r.Code != http.StatusOK || !strings.Contains(r.Body.String(), "How to read this code") {
		t.Errorf("GET /code/README.md: %d, its text shown: %v", r.Code, strings.Contains(r.Body.String(), "How to read this code"))
	}
}
