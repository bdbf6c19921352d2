package views

import (
	"bytes"

	"github.com/a-h/templ"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/text"
)

// The docs in the browser: goldmark with GitHub's tables and strikethrough,
// ids on headings (so "recovery.md#the-decision-tree" lands), and raw HTML
// left out — a doc is text, and goldmark's default refuses javascript: and
// other dangerous links as well.

var markdown = goldmark.New(
	goldmark.WithExtensions(extension.GFM),
	goldmark.WithParserOptions(parser.WithAutoHeadingID()),
)

// Markdown renders a document, with every link and image passed through
// link first: a doc's relative links name files of the repository, and
// only the caller knows the page each one has in the browser.
func Markdown(src []byte, link func(dest string) string) (templ.Component, error) {
	doc := markdown.Parser().Parse(text.NewReader(src))
	err := ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Link:
			n.Destination = []byte(link(string(n.Destination)))
		case *ast.Image:
			n.Destination = []byte(link(string(n.Destination)))
		}
		return ast.WalkContinue, nil
	})
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := markdown.Renderer().Render(&out, src, doc); err != nil {
		return nil, err
	}
	return templ.Raw(out.String()), nil
}
