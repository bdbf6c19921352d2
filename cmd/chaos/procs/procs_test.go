package procs

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/testenv"
)

// The test binary is its own child process: with CHAOS_TEST_CHILD set it
// serves /healthz on ADDR and then behaves as asked — serves on, dies at a
// "crash point", or exits on its own.
func TestMain(m *testing.M) {
	switch os.Getenv("CHAOS_TEST_CHILD") {
	case "":
		os.Exit(m.Run())
	case "serve", "crash", "exit":
		child(os.Getenv("CHAOS_TEST_CHILD"))
	}
}

func child(mode string) {
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {})
	go http.ListenAndServe(os.Getenv("ADDR"), nil)
	time.Sleep(300 * time.Millisecond)
	switch mode {
	case "crash":
		fmt.Println(`{"level":"WARN","msg":"crash point: killing the process","at":"after_claim"}`)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "exit":
		fmt.Println("web: database: ping: connection refused")
		os.Exit(1)
	}
	select {}
}

// exits collects what the supervisor reports.
type exits struct {
	mu   sync.Mutex
	list []Exit
}

func (e *exits) add(ex Exit) { e.mu.Lock(); e.list = append(e.list, ex); e.mu.Unlock() }
func (e *exits) wait(t *testing.T, n int) []Exit {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e.mu.Lock()
		if len(e.list) >= n {
			out := append([]Exit(nil), e.list...)
			e.mu.Unlock()
			return out
		}
		e.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d exits reported", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func start(t *testing.T, mode string, ex *exits) *Process {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	p, err := Start(context.Background(), Spec{
		Name: "child", Bin: self, Env: []string{"CHAOS_TEST_CHILD=" + mode, "ADDR=" + addr},
		Addr: addr, ReadyPath: "/healthz", LogPath: filepath.Join(t.TempDir(), "child.log"),
	}, ex.add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(2 * time.Second) })
	return p
}

func TestAKilledProcessIsReportedAndStartedAgain(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	var ex exits
	p := start(t, "serve", &ex)
	if !p.Serving() {
		t.Fatal("not serving after Start")
	}
	if !p.Kill(100*time.Millisecond, "EXTRA=1") {
		t.Fatal("Kill found nothing to kill")
	}
	got := ex.wait(t, 1)
	if got[0].Reason != ByNemesis || !strings.Contains(got[0].Status, "killed") {
		t.Fatalf("exit %+v, want killed by the nemesis", got[0])
	}
	if err := p.WaitReady(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Runs() != 2 {
		t.Fatalf("runs = %d, want 2", p.Runs())
	}
}

func TestACrashPointExitIsToldFromAnExitOnItsOwn(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	var crashed, exited exits
	start(t, "crash", &crashed)
	start(t, "exit", &exited)
	c := crashed.wait(t, 1)[0]
	if c.Reason != ByCrash || c.Point != "after_claim" {
		t.Fatalf("crash exit %+v, want ByCrash at after_claim", c)
	}
	e := exited.wait(t, 1)[0]
	if e.Reason != OnItsOwn || e.Status != "exit status 1" || !strings.Contains(e.LogTail, "database: ping") {
		t.Fatalf("own exit %+v, want OnItsOwn with the log's last lines", e)
	}
	// Both are started again by the supervisor.
	crashed.wait(t, 2)
	exited.wait(t, 2)
}

func TestAPausedProcessDoesNotServeUntilResumed(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	var ex exits
	p := start(t, "serve", &ex)
	if !p.Pause() || p.Serving() {
		t.Fatal("Pause did not pause")
	}
	client := &http.Client{Timeout: 300 * time.Millisecond}
	if _, err := client.Get(p.URL() + "/healthz"); err == nil {
		t.Fatal("a stopped process answered")
	}
	p.Resume()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(p.URL() + "/healthz")
	if err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	resp.Body.Close()
}

func TestARestartIsNotAKill(t *testing.T) {
	testenv.SkipIfShort(t, "starts child processes")
	t.Parallel()
	var ex exits
	p := start(t, "serve", &ex)
	p.SetEnv("PROVIDER_IDEMPOTENT_CALLS=false")
	p.Restart(50 * time.Millisecond)
	if got := ex.wait(t, 1)[0]; got.Reason != ByRestart {
		t.Fatalf("exit %+v, want ByRestart", got)
	}
}
