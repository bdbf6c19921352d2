package workflow

import (
	"runtime"
	"testing"
)

func TestSplitFuncNamesTheWriter(t *testing.T) {
	for full, want := range map[string][2]string{
		"github.com/idemlab/idemlab/internal/workflow.(*runner).succeed":               {"internal/workflow", "(*runner).succeed"},
		"github.com/idemlab/idemlab/internal/workflow.(*Engine).claimSkipLocked.func1": {"internal/workflow", "(*Engine).claimSkipLocked"},
		"github.com/idemlab/idemlab/internal/workflow.(*runner).advance.func2.1":       {"internal/workflow", "(*runner).advance"},
		"github.com/idemlab/idemlab/internal/workflow.recordRetry":                     {"internal/workflow", "recordRetry"},
		"github.com/idemlab/idemlab/internal/workflow.run[...]":                        {"internal/workflow", "run"},
		"github.com/idemlab/idemlab/internal/policies.(*Canceller).Cancel":             {"internal/policies", "(*Canceller).Cancel"},
	} {
		pkg, name, ok := splitFunc(full)
		if !ok || pkg != want[0] || name != want[1] {
			t.Errorf("splitFunc(%q) = %q, %q, %v; want %q", full, pkg, name, ok, want)
		}
	}
	for _, full := range []string{"github.com/jackc/pgx/v5.BeginFunc", "runtime.goexit", "main.main"} {
		if _, _, ok := splitFunc(full); ok {
			t.Errorf("splitFunc(%q) claims a function of this repository", full)
		}
	}
}

func TestWriterOfSkipsThePlumbing(t *testing.T) {
	var r runner
	r.event(nil, nil, "", "", "", "")
	r.event(nil, nil, "", "", "", "") // what is cached per place answers the same
	noteAnotherLine(&r)               // and the plumbing's place, cached as passed over, still leads to its caller
	want := []string{
		"internal/workflow/writer_test.go:TestWriterOfSkipsThePlumbing",
		"internal/workflow/writer_test.go:TestWriterOfSkipsThePlumbing",
		"internal/workflow/writer_test.go:noteAnotherLine",
	}
	for i, w := range want {
		if got := r.events[i].writer; got != w {
			t.Errorf("line %d: writer = %q, want %q", i, got, w)
		}
	}
}

//go:noinline
func noteAnotherLine(r *runner) { r.event(nil, nil, "", "", "", "") }

// BenchmarkWriterOf: the writer of a timeline line, from the cache and
// resolved from the stack as every line did before the cache.
func BenchmarkWriterOf(b *testing.B) {
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			writerOf()
		}
	})
	b.Run("resolved", func(b *testing.B) {
		for b.Loop() {
			var pcs [24]uintptr
			n := runtime.Callers(1, pcs[:])
			for _, pc := range pcs[:n] {
				if writerAt(pc) != "" {
					break
				}
			}
		}
	})
}
