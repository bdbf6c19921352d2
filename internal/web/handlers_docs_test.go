package web

import (
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab"
)

// getDoc renders GET /docs/{name} without a session, as a reader who is not
// signed in sees it.
func getDoc(t *testing.T, name string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	e := echo.New()
	rec := httptest.NewRecorder()
	c := e.NewContext(httptest.NewRequest(http.MethodGet, "/docs/"+name, nil), rec)
	c.SetParamNames("name")
	c.SetParamValues(name)
	return rec, (&App{}).handleDocPage(c)
}

var hrefs = regexp.MustCompile(`href="([^"]*)"`)

// Every document renders, and every link it has into the docs or the code
// viewer lands on a file the embedded tree has: no doc sends a reader to a
// 404.
func TestEveryDocRendersAndItsLinksLand(t *testing.T) {
	names := []string{"README", "SECURITY"}
	entries, err := fs.ReadDir(idemlab.Source(), "docs")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if path.Ext(e.Name()) == ".md" {
			names = append(names, strings.TrimSuffix(e.Name(), ".md"))
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d docs: %v", len(names), names)
	}
	for _, name := range names {
		rec, err := getDoc(t, name)
		if err != nil || rec.Code != http.StatusOK {
			t.Errorf("/docs/%s: %d %v", name, rec.Code, err)
			continue
		}
		links := 0
		for _, m := range hrefs.FindAllStringSubmatch(rec.Body.String(), -1) {
			u, err := url.Parse(strings.ReplaceAll(m[1], "&amp;", "&"))
			if err != nil {
				t.Errorf("/docs/%s: link %q: %v", name, m[1], err)
				continue
			}
			switch {
			case strings.HasPrefix(u.Path, "/docs/") && u.Path != "/docs/":
				links++
				if _, ok := docFile(strings.TrimPrefix(u.Path, "/docs/")); !ok {
					t.Errorf("/docs/%s links to %s: no such doc", name, m[1])
				}
			case strings.HasPrefix(u.Path, "/code/") && u.Path != "/code/":
				links++
				if _, err := fs.Stat(idemlab.Source(), strings.TrimSuffix(strings.TrimPrefix(u.Path, "/code/"), "/")); err != nil {
					t.Errorf("/docs/%s links to %s: not in the tree", name, m[1])
				}
			case strings.HasSuffix(u.Path, ".md") || strings.HasPrefix(m[1], "../"):
				t.Errorf("/docs/%s keeps a repository link %q a browser cannot follow", name, m[1])
			}
		}
		if name == "README" && links < 20 {
			t.Errorf("the README has %d links into the docs and the code; its rewriting is off", links)
		}
	}
}

func TestUnknownDocsAreNotFound(t *testing.T) {
	for _, name := range []string{"nope", "..", "../go.mod", ".hidden", "docs", "api.md.md", "a%00b", "README.md/x", ""} {
		_, err := getDoc(t, name)
		var he *echo.HTTPError
		if !errors.As(err, &he) || he.Code != http.StatusNotFound {
			t.Errorf("/docs/%q: %v, want 404", name, err)
		}
	}
}

func TestDocLinksAreRewritten(t *testing.T) {
	for _, tc := range []struct{ from, dest, want string }{
		{"docs/recovery.md", "workflows.md", "/docs/workflows"},
		{"docs/recovery.md", "provider.md#deadlines", "/docs/provider#deadlines"},
		{"docs/recovery.md", "../internal/recovery/loop.go", "/code/internal/recovery/loop.go"},
		{"docs/recovery.md", "../README.md", "/docs/README"},
		{"README.md", "docs/api.md", "/docs/api"},
		{"README.md", "internal/recovery/", "/code/internal/recovery"},
		{"README.md", "internal/workflow/run.go#L10", "/code/internal/workflow/run.go#L10"},
		{"README.md", "#how-to-read-this-code", "#how-to-read-this-code"},
		{"README.md", "https://example.org/x.md", "https://example.org/x.md"},
		{"README.md", "../outside.md", "../outside.md"},
		{"docs/labs.md", "chaos-long-run.png", "/docs/chaos-long-run.png"},
	} {
		if got := docLink(tc.from, tc.dest); got != tc.want {
			t.Errorf("docLink(%q, %q) = %q, want %q", tc.from, tc.dest, got, tc.want)
		}
	}
}
