package views

import (
	"bytes"
	"path"
	"strings"
	"sync"

	"github.com/a-h/templ"
	"github.com/alecthomas/chroma/v2"
	"github.com/alecthomas/chroma/v2/formatters/html"
	"github.com/alecthomas/chroma/v2/lexers"
	"github.com/alecthomas/chroma/v2/styles"
)

// The code viewer's highlighting: chroma with CSS classes (one stylesheet,
// CodeCSS, instead of inline styles on every token), a number on every line
// that is its own link (#L120), and no JavaScript — the line a link points
// at is marked by CSS (:target, in app.css).

var codeStyle = styles.Get("github")

var codeFormatter = html.New(
	html.WithClasses(true),
	html.WithLineNumbers(true),
	html.WithLinkableLineNumbers(true, "L"),
	html.TabWidth(4),
)

// highlighted keeps each file rendered once: the embedded source cannot
// change, and chroma takes a quarter of a second on a long file. At most
// highlightedMax files are kept (the tree has a few hundred).
var (
	highlightedMu sync.Mutex
	highlighted   = map[string]string{}
)

const highlightedMax = 400

// Highlight renders src, the file at name, with line numbers and
// highlighting. A file chroma has no lexer for is shown as plain text.
func Highlight(name string, src []byte) (templ.Component, error) {
	highlightedMu.Lock()
	html, ok := highlighted[name]
	highlightedMu.Unlock()
	if ok {
		return templ.Raw(html), nil
	}
	html, err := highlight(name, src)
	if err != nil {
		return nil, err
	}
	highlightedMu.Lock()
	if len(highlighted) < highlightedMax {
		highlighted[name] = html
	}
	highlightedMu.Unlock()
	return templ.Raw(html), nil
}

func highlight(name string, src []byte) (string, error) {
	lexer := lexers.Match(path.Base(name))
	if lexer == nil && strings.HasSuffix(name, ".templ") {
		lexer = lexers.Get("go")
	}
	if lexer == nil {
		lexer = lexers.Fallback
	}
	tokens, err := chroma.Coalesce(lexer).Tokenise(nil, string(src))
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := codeFormatter.Format(&b, codeStyle, tokens); err != nil {
		return "", err
	}
	return b.String(), nil
}

var codeCSS = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	if err := codeFormatter.WriteCSS(&b, codeStyle); err != nil {
		panic(err) // the style is built in: it cannot fail but by a bug
	}
	return b.Bytes()
})

// CodeCSS is the stylesheet of Highlight's classes, served at
// /static/code.css.
func CodeCSS() []byte { return codeCSS() }
