// Package idemlab holds what belongs to the whole repository rather than to
// one part of the app: today, the app's own source, embedded at build time.
//
// The pages link each step of a timeline and each lab to the lines of code
// that make the difference, and the reference is only worth studying if the
// link still points at the right line after the next edit. Embedding the tree
// lets the app find a line by what it says (never by a number written down by
// hand) and serve it read-only, offline and inside a container alike.
package idemlab

import (
	"embed"
	"io/fs"
	"strings"
)

// The Docker build context leaves out the Dockerfile and compose file
// (.dockerignore), so the tree embedded is what every build has.
//
//go:embed README.md SECURITY.md go.mod Makefile cmd internal migrations views docs scripts
var tree embed.FS

// Source is the repository as it was built, rooted at the repository's root.
func Source() fs.FS { return tree }

// LineOf returns the 1-based number of the first line of path whose trimmed
// text is text, or 0 when no line is. Matching the whole line keeps a
// reference from landing on a comment that merely mentions the code.
func LineOf(path, text string) int {
	return firstLine(path, func(line string) bool { return strings.TrimSpace(line) == text })
}

// firstLine returns the 1-based number of the first line of path that
// matches, or 0 when none does (or there is no such file).
func firstLine(path string, matches func(line string) bool) int {
	raw, err := fs.ReadFile(tree, path)
	if err != nil {
		return 0
	}
	for i, line := range strings.Split(string(raw), "\n") {
		if matches(line) {
			return i + 1
		}
	}
	return 0
}

// DeclLine finds the declaration of the package-level constant or variable
// name in the Go files of dir ("internal/workflow") — "const name =" or
// "var name =" — and returns its file and 1-based line, or "", 0 when dir
// declares no such name. Like LineOf, it finds the line by what it says, so
// it follows every edit: the timeline names a statement by its constant
// ("workflow.sqlStepSent") and the page links the name here.
func DeclLine(dir, name string) (path string, line int) {
	entries, err := fs.ReadDir(tree, dir)
	if err != nil {
		return "", 0
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		p := dir + "/" + e.Name()
		n := firstLine(p, func(line string) bool {
			rest, ok := strings.CutPrefix(line, "const ")
			if !ok {
				rest, ok = strings.CutPrefix(line, "var ")
			}
			return ok && strings.HasPrefix(rest, name+" =")
		})
		if n > 0 {
			return p, n
		}
	}
	return "", 0
}
