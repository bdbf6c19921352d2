package workflow

import (
	"encoding/json"
	"fmt"
	"path"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Each timeline line names the function that wrote it, so the operation
// page can link the transition to its code (/code/, the source embedded at
// build time) and a reader goes from "this happened" to "this is why". The
// name is read from the call stack when the line is noted — never written
// by hand, so it cannot drift from the code — and the page finds the
// function's line in the embedded source by what the line says.

// modulePath is the import path the repository's packages start with.
const modulePath = "github.com/idemlab/idemlab/"

// plumbing are the functions that record lines for others: the writer is
// the first caller outside them.
var plumbing = map[string]bool{
	"(*runner).event":      true,
	"(*runner).transition": true,
	"(*runner).fenced":     true,
	"recordEvent":          true,
	"recordClaims":         true,
	"writerOf":             true,
}

// closure is the suffix the compiler gives a function literal (".func1",
// ".func2.1") and generic instantiation ("[...]"): the writer is the
// function the literal is written in.
var closure = regexp.MustCompile(`(\.func\d+(\.\d+)*|\[\.\.\.\])+$`)

// writerOf names the function, in a package of this repository, that is
// recording a timeline line: "internal/workflow/run.go:(*runner).succeed".
// "" when the stack holds none (it always does, but a line without a name
// is better than no line).
func writerOf() string {
	var pcs [24]uintptr
	n := runtime.Callers(2, pcs[:])
	for _, pc := range pcs[:n] {
		w, ok := writers.Load(pc)
		if !ok {
			w, _ = writers.LoadOrStore(pc, writerAt(pc))
		}
		if w := w.(string); w != "" {
			return w
		}
	}
	return ""
}

// writers caches what writerAt says of each program counter: a program has
// few places that record lines, and resolving frames and trimming closure
// names per line cost a tenth of the app's CPU in a cancellation (pprof of
// the load test) — more than the timeline's insert.
var writers sync.Map // uintptr → string

// writerAt is the writer pc is in — the first of its frames (more than one
// where the compiler inlined a call) that belongs to this repository and is
// not plumbing — or "" when pc's frames are all to be passed over.
func writerAt(pc uintptr) string {
	frames := runtime.CallersFrames([]uintptr{pc})
	for {
		f, more := frames.Next()
		if pkg, name, ok := splitFunc(f.Function); ok && !plumbing[name] {
			return pkg + "/" + path.Base(f.File) + ":" + name
		}
		if !more {
			return ""
		}
	}
}

// splitFunc splits a runtime function name of this repository,
// "github.com/idemlab/idemlab/internal/workflow.(*runner).succeed.func1",
// into its package's folder and the function ("internal/workflow",
// "(*runner).succeed").
func splitFunc(full string) (pkg, name string, ok bool) {
	rest, ok := strings.CutPrefix(full, modulePath)
	if !ok {
		return "", "", false
	}
	slash := strings.LastIndex(rest, "/")
	dot := strings.Index(rest[slash+1:], ".")
	if dot < 0 {
		return "", "", false
	}
	pkg, name = rest[:slash+1+dot], rest[slash+1+dot+1:]
	return pkg, closure.ReplaceAllString(name, ""), true
}

// boundJSON is a statement's values as a JSON array for the timeline,
// each as the page shows it (nil: none known).
func boundJSON(args []any) *string {
	if args == nil {
		return nil
	}
	shown := make([]any, len(args))
	for i, a := range args {
		shown[i] = boundValue(a)
	}
	b, err := json.Marshal(shown)
	if err != nil {
		return nil
	}
	s := string(b)
	return &s
}

// boundValue is one value as it went to PostgreSQL: JSON documents as
// text, times in UTC, pointers followed.
func boundValue(a any) any {
	switch v := a.(type) {
	case nil:
		return nil
	case json.RawMessage:
		return string(v)
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case *time.Time:
		if v == nil {
			return nil
		}
		return v.UTC().Format(time.RFC3339Nano)
	case *string:
		if v == nil {
			return nil
		}
		return *v
	case []*string:
		out := make([]any, len(v))
		for i, s := range v {
			out[i] = boundValue(s)
		}
		return out
	case string, bool, int, int32, int64, float64, []string:
		return v
	case fmt.Stringer:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}
