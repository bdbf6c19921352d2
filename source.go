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

// FuncLine returns the 1-based number of the line of path that declares the
// function name — "recordRetry", or a method as the runtime names it,
// "(*runner).succeed" or "claimed.claim" — or 0 when path declares no such
// function. Like LineOf, it finds the line by what it says, so it follows
// every edit.
func FuncLine(path, name string) int {
	var recv string
	if strings.HasPrefix(name, "(") {
		end := strings.Index(name, ").")
		if end < 0 {
			return 0
		}
		recv, name = name[1:end], name[end+2:]
	} else if t, m, ok := strings.Cut(name, "."); ok {
		recv, name = t, m
	}
	return firstLine(path, func(line string) bool {
		rest, ok := strings.CutPrefix(line, "func ")
		if !ok {
			return false
		}
		if recv != "" {
			// "(r *runner) succeed(": the receiver's name is the author's.
			lp, rp := strings.Index(rest, "("), strings.Index(rest, ")")
			if lp != 0 || rp < 0 {
				return false
			}
			fields := strings.Fields(rest[1:rp])
			if len(fields) == 0 || fields[len(fields)-1] != recv {
				return false
			}
			rest = strings.TrimSpace(rest[rp+1:])
		} else if strings.HasPrefix(rest, "(") {
			return false
		}
		return strings.HasPrefix(rest, name+"(") || strings.HasPrefix(rest, name+"[")
	})
}
