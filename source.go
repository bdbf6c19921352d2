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
//go:embed go.mod Makefile cmd internal migrations views docs
var tree embed.FS

// Source is the repository as it was built, rooted at the repository's root.
func Source() fs.FS { return tree }

// LineOf returns the 1-based number of the first line of path whose trimmed
// text is text, or 0 when no line is. Matching the whole line keeps a
// reference from landing on a comment that merely mentions the code.
func LineOf(path, text string) int {
	raw, err := fs.ReadFile(tree, path)
	if err != nil {
		return 0
	}
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == text {
			return i + 1
		}
	}
	return 0
}
