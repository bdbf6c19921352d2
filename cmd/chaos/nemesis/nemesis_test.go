package nemesis

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/cmd/chaos/procs"
	"github.com/idemlab/idemlab/internal/testenv"
)

// The test binary plays the app instances and the fake: with
// CHAOS_TEST_CHILD set it serves the few endpoints the nemesis calls and
// appends each call, in order, to the file in CHAOS_TEST_JOURNAL.
func TestMain(m *testing.M) {
	if os.Getenv("CHAOS_TEST_CHILD") == "" {
		os.Exit(m.Run())
	}
	note := func(s string) {
		f, _ := os.OpenFile(os.Getenv("CHAOS_TEST_JOURNAL"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		fmt.Fprintln(f, s)
		f.Close()
	}
	name := os.Getenv("CHAOS_TEST_CHILD")
	if name != "fake" {
		note(fmt.Sprintf("start %s believes %s", name, os.Getenv("PROVIDER_IDEMPOTENT_CALLS")))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /api/v1/admin/systems", func(w http.ResponseWriter, r *http.Request) {
		if os.Getenv("BELIEF_ENDPOINT") == "" {
			http.NotFound(w, r)
		}
	})
	mux.HandleFunc("PUT /api/v1/admin/systems/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		note("belief " + string(b))
	})
	mux.HandleFunc("PUT /v1/faults", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		note("faults " + string(b))
	})
	http.ListenAndServe(os.Getenv("ADDR"), mux)
}

func child(t *testing.T, name, journal string, env ...string) *procs.Process {
	t.Helper()
	addr, _ := procs.FreeAddr()
	self, _ := os.Executable()
	p, err := procs.Start(context.Background(), procs.Spec{
		Name: name, Bin: self, Addr: addr, ReadyPath: "/healthz",
		Env:     append([]string{"CHAOS_TEST_CHILD=" + name, "CHAOS_TEST_JOURNAL=" + journal, "ADDR=" + addr, "PROVIDER_IDEMPOTENT_CALLS=true"}, env...),
		LogPath: filepath.Join(t.TempDir(), name+".log"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(2 * time.Second) })
	return p
}

func setup(t *testing.T, env ...string) (*Nemesis, Fake, string) {
	journal := filepath.Join(t.TempDir(), "journal")
	apps := []*procs.Process{child(t, "app-1", journal, env...), child(t, "app-2", journal, env...)}
	f := Fake{Name: "provider", Process: child(t, "fake", journal), IdempotentEnv: "PROVIDER_IDEMPOTENT_CALLS"}
	n := New(Config{}, Targets{Apps: apps, Fakes: []Fake{f}, AdminToken: "t"}, history.NewLog(1))
	n.beliefAtRun = n.app.canTellBelief(context.Background(), apps[0].URL())
	return n, f, journal
}

func journalLines(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasPrefix(l, "start") || strings.Contains(l, "false") {
			out = append(out, l) // the first starts (believing true) are noise here
		}
	}
	return out
}

// The harness must never be the cause of a double effect: the app hears
// "not idempotent" before the fake becomes so, and "idempotent" only after.
func TestTheAppIsToldBeforeTheFakeStopsBeingIdempotent(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	n, f, journal := setup(t, "BELIEF_ENDPOINT=1")
	if !n.beliefAtRun {
		t.Fatal("the belief endpoint was not found")
	}
	ctx := context.Background()
	if err := n.setIdempotent(ctx, f, fault{Mode: "lost_response", Idempotent: false, StatusMode: "ok"}, false, history.Flip); err != nil {
		t.Fatal(err)
	}
	if err := n.setIdempotent(ctx, f, healthy(), true, history.Flip); err != nil {
		t.Fatal(err)
	}
	got := journalLines(t, journal)
	want := []string{
		`belief {"believed_idempotent":false}`,
		`faults {"mode":"lost_response","idempotent":false,"status_mode":"ok"}`,
		`faults {"mode":"ok","idempotent":true,"status_mode":"ok"}`,
		`belief {"believed_idempotent":true}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("journal:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Without the endpoint, both instances restart with the variable before
// the fake changes.
func TestWithoutTheEndpointBothInstancesRestartFirst(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	n, f, journal := setup(t)
	if n.beliefAtRun {
		t.Fatal("a belief endpoint was found on a child without one")
	}
	if err := n.setIdempotent(context.Background(), f, fault{Mode: "drop", Idempotent: false, StatusMode: "ok"}, false, history.Flip); err != nil {
		t.Fatal(err)
	}
	got := journalLines(t, journal)
	if len(got) != 3 || !strings.HasPrefix(got[0], "start app-") || !strings.HasPrefix(got[1], "start app-") || !strings.HasPrefix(got[2], "faults ") {
		t.Fatalf("journal, want both instances restarted believing false, then the fault:\n%s", strings.Join(got, "\n"))
	}
}

// Never both instances at once: while one is disturbed the other is left
// alone.
func TestOnlyOneAppInstanceIsDisturbedAtATime(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	n, _, _ := setup(t, "BELIEF_ENDPOINT=1")
	rng := rand.New(rand.NewPCG(1, 1))
	first, ok := n.calmApp(rng)
	if !ok {
		t.Fatal("no instance could be disturbed with both serving")
	}
	for range 20 {
		if other, ok := n.calmApp(rng); ok {
			t.Fatalf("%s disturbed while %s is", other.Name(), first.Name())
		}
	}
	n.calm(first)
	if _, ok := n.calmApp(rng); !ok {
		t.Fatal("no instance could be disturbed after the first was calm again")
	}
}
