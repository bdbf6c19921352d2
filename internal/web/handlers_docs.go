package web

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/views"
)

// The docs in the browser: the same read-only embedded tree as the code
// viewer (package idemlab), each Markdown file rendered, its links between
// docs and into the code rewritten to the pages that show them.

// docFile is the file in the embedded tree that a doc's name stands for:
// "README" and "SECURITY" at the root, anything else under docs/ — "recovery"
// or "recovery.md", and the images the docs show. ok is false for a name the
// tree does not have.
func docFile(name string) (file string, ok bool) {
	if strings.ContainsAny(name, "/\\\x00") || name == "" || strings.HasPrefix(name, ".") {
		return "", false
	}
	if path.Ext(name) == "" {
		name += ".md"
	}
	file = "docs/" + name
	if name == "README.md" || name == "SECURITY.md" {
		file = name
	}
	info, err := fs.Stat(idemlab.Source(), file)
	return file, err == nil && !info.IsDir()
}

// docHref is the page of a file of the tree: a doc's own page, or the code
// viewer's.
func docHref(file string) string {
	switch {
	case file == "README.md" || file == "SECURITY.md":
		return "/docs/" + strings.TrimSuffix(file, ".md")
	case strings.HasPrefix(file, "docs/") && !strings.Contains(file[len("docs/"):], "/"):
		return "/docs/" + strings.TrimSuffix(file[len("docs/"):], ".md")
	}
	return "/code/" + file
}

// docLink rewrites one link of the doc at from: an address with a scheme,
// an anchor of the same page or a path outside the tree is kept as written;
// a path relative to the doc becomes the page that shows that file.
func docLink(from, dest string) string {
	u, err := url.Parse(dest)
	if err != nil || u.Scheme != "" || u.Host != "" || u.Path == "" || strings.HasPrefix(u.Path, "/") {
		return dest
	}
	file := path.Clean(path.Join(path.Dir(from), u.Path))
	if file == ".." || strings.HasPrefix(file, "../") {
		return dest
	}
	if u.Fragment != "" {
		return docHref(file) + "#" + u.Fragment
	}
	return docHref(file)
}

// handleDocsIndex: GET /docs/ — every doc, the README first.
func (app *App) handleDocsIndex(c echo.Context) error {
	v := views.DocsIndexView{Docs: []views.DocEntry{docEntry("README.md")}}
	entries, err := fs.ReadDir(idemlab.Source(), "docs")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if path.Ext(e.Name()) == ".md" {
			v.Docs = append(v.Docs, docEntry("docs/"+e.Name()))
		}
	}
	v.Docs = append(v.Docs, docEntry("SECURITY.md"))
	return render(c, http.StatusOK, views.DocsIndexPage(app.page(c, "Docs", "docs"), v))
}

func docEntry(file string) views.DocEntry {
	raw, _ := fs.ReadFile(idemlab.Source(), file)
	return views.DocEntry{Href: docHref(file), File: file, Title: docTitle(raw, file)}
}

// docTitle is the text of a doc's first heading, or its file name.
func docTitle(raw []byte, file string) string {
	for line := range bytes.Lines(raw) {
		if t, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("# ")); ok {
			return string(t)
		}
	}
	return file
}

// handleDocPage: GET /docs/:name — one doc rendered ("recovery",
// "recovery.md", "README"), or an image a doc shows; 404 for a name the
// tree does not have.
func (app *App) handleDocPage(c echo.Context) error {
	file, ok := docFile(c.Param("name"))
	if !ok {
		return errNoSuchCode
	}
	raw, err := fs.ReadFile(idemlab.Source(), file)
	if err != nil {
		return errNoSuchCode
	}
	if path.Ext(file) != ".md" {
		// An image a doc shows (docs/chaos-long-run.png): the bytes, typed
		// by their extension; nothing else is under docs/.
		c.Response().Header().Set("Cache-Control", "public, max-age=3600")
		return c.Blob(http.StatusOK, mimeOf(file), raw)
	}
	body, err := views.Markdown(raw, func(dest string) string { return docLink(file, dest) })
	if err != nil {
		return err
	}
	title := docTitle(raw, file)
	v := views.DocView{File: file, Title: title, Body: body, Source: "/code/" + file}
	return render(c, http.StatusOK, views.DocPage(app.page(c, title, "docs"), v))
}

// mimeOf is the content type of an image under docs/.
func mimeOf(file string) string {
	switch path.Ext(file) {
	case ".png":
		return "image/png"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}
