package web

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/views"
)

// The code viewer: the repository embedded at build time (package idemlab),
// served read-only. Timelines and labs link here by line (CodeHref), so a
// reader goes from "this transition happened" to the function that wrote it.

// errNoSuchCode is a path the embedded source does not have.
var errNoSuchCode = echo.NewHTTPError(http.StatusNotFound)

// CodeHref is the viewer's URL of line in the file at path ("" when line is
// 0: a reference that no longer finds its line links nowhere).
func CodeHref(path string, line int) string {
	if line <= 0 {
		return ""
	}
	return "/code/" + path + "#L" + strconv.Itoa(line)
}

// handleCodePage: GET /code/* — a file with its lines numbered and
// highlighted, or a folder's contents.
func (app *App) handleCodePage(c echo.Context) error {
	name, err := codePath(c.Param("*"))
	if err != nil {
		return err
	}
	src := idemlab.Source()
	info, err := fs.Stat(src, name)
	if err != nil {
		return errNoSuchCode
	}
	v := views.CodeView{Path: strings.TrimPrefix(name, "."), Crumbs: codeCrumbs(name)}
	if info.IsDir() {
		entries, err := fs.ReadDir(src, name)
		if err != nil {
			return errNoSuchCode
		}
		sort.SliceStable(entries, func(i, j int) bool { return entries[i].IsDir() && !entries[j].IsDir() })
		for _, e := range entries {
			href := "/code/" + path.Join(v.Path, e.Name())
			if e.IsDir() {
				href += "/"
			}
			v.Entries = append(v.Entries, views.CodeEntry{Name: e.Name(), Href: href, Dir: e.IsDir()})
		}
	} else {
		raw, err := fs.ReadFile(src, name)
		if err != nil {
			return errNoSuchCode
		}
		if v.Source, err = views.Highlight(name, raw); err != nil {
			return err
		}
		v.Lines = bytes.Count(raw, []byte("\n"))
		if len(raw) > 0 && raw[len(raw)-1] != '\n' {
			v.Lines++
		}
	}
	title := "Code"
	if v.Path != "" {
		title = v.Path
	}
	return render(c, http.StatusOK, views.CodePage(app.page(c, title, ""), v))
}

// codePath turns the URL's path into a name in the embedded tree: the root
// is ".", and anything fs.ValidPath refuses (.., empty elements, a leading
// slash) is a 404 — the tree has nothing above its root to reach.
func codePath(raw string) (string, error) {
	p, err := url.PathUnescape(raw)
	if err != nil {
		return "", errNoSuchCode
	}
	p = strings.TrimSuffix(p, "/")
	if p == "" {
		return ".", nil
	}
	if !fs.ValidPath(p) || strings.ContainsAny(p, "\\\x00") {
		return "", errNoSuchCode
	}
	return p, nil
}

// codeCrumbs are the links from the root to name's folder.
func codeCrumbs(name string) []views.CodeCrumb {
	crumbs := []views.CodeCrumb{{Name: "idemlab", Href: "/code/"}}
	if name == "." {
		return crumbs
	}
	parts := strings.Split(name, "/")
	for i, part := range parts {
		href := "/code/" + strings.Join(parts[:i+1], "/")
		if i < len(parts)-1 {
			href += "/"
		}
		crumbs = append(crumbs, views.CodeCrumb{Name: part, Href: href})
	}
	return crumbs
}

// handleCodeCSS: GET /static/code.css — the highlighting's stylesheet.
func (app *App) handleCodeCSS(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=3600")
	return c.Blob(http.StatusOK, "text/css; charset=utf-8", views.CodeCSS())
}
