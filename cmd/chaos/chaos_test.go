package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/internal/testenv"
)

// TestChaosSoakBreaksNoPromise is the chaos run of make test: the
// tool itself, built from this tree, for 40 s with the default nemesis —
// kills, crash points, pauses, network delays and held calls, fault flips,
// database restarts — then the heal, the drain and every check. Any
// violation fails the test with the run's summary; the report, history and
// logs stay in the test's folder (printed on failure).
func TestChaosSoakBreaksNoPromise(t *testing.T) {
	testenv.SkipIfShort(t, "the chaos soak: processes killed, paused and restarted")
	out := t.TempDir()
	// Inside make test's 30 minutes a package: on a loaded machine the tool's
	// own go build of cmd/web alone outlived the 7 minutes this was.
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	// Seed 2207's draws decide every kind of fault within the first 18 s
	// (each kind draws from a stream of its own: the same seed makes the
	// same decisions, only their count depends on the machine); 40 s leaves
	// room for a slow restart. Seed 11 at 60 s never held a call.
	// The app as it ships, built once per suite (testenv.AppBinary).
	code := run(ctx, []string{"-bin", testenv.AppBinary(t), "-duration", "40s", "-drain", "2m", "-seed", "2207", "-quiet", "-out", out}, &stdout, &stderr)
	if code != exitOK {
		keep := filepath.Join(os.TempDir(), "chaos-test-"+time.Now().Format("150405"))
		os.CopyFS(keep, os.DirFS(out))
		t.Fatalf("chaos run exited %d (report and logs in %s)\n%s\n%s", code, keep, stdout.String(), stderr.String())
	}
	t.Log(stdout.String())

	// The shortest run that proves anything has to have done everything:
	// every kind of fault the default nemesis injects, at least once (a
	// seed, a duration or a machine whose timing left one out would pass
	// while testing less).
	b, err := os.ReadFile(filepath.Join(out, "history.json"))
	if err != nil {
		t.Fatal(err)
	}
	var h struct{ Faults []history.Fault }
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	injected := map[string]int{}
	for _, f := range h.Faults {
		injected[f.Kind]++
	}
	for _, kind := range []string{history.Kill, history.CrashKill, history.Pause, history.Delay, history.Hold,
		history.Flip, history.Belief, history.DBRestart, history.DBDown, history.Callbacks, history.Reorder} {
		if injected[kind] == 0 {
			t.Errorf("no %s in this run (faults by kind: %v): the soak must exercise every kind once", kind, injected)
		}
	}
}
