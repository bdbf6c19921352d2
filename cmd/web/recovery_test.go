package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/testenv"
)

// TestMain lets a test re-execute this test binary as the server: with
// IDEMLAB_CHILD=1 it runs run() with IDEMLAB_CHILD_ARGS and the process
// environment, as main would, and exits. The two-process crash test needs
// a process it can SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("IDEMLAB_CHILD") == "1" {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		err := run(ctx, strings.Fields(os.Getenv("IDEMLAB_CHILD_ARGS")), os.Getenv, os.Stdout, os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "web:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	testenv.StopNATS()
	os.Exit(code)
}

// externalProvider serves the fake provider from the test process, outside
// the servers under test, as a real provider would be: it outlives their
// crashes.
func externalProvider(t *testing.T, db *testdb.DB) (*fake.Provider, string) {
	t.Helper()
	prov := fake.New(db.Pool, fake.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv := httptest.NewServer(prov.Handler())
	t.Cleanup(func() { prov.Close(); srv.Close() })
	return prov, srv.URL
}

// childServer is `web serve` in its own process.
type childServer struct {
	URL    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has ended
}

// waitExit waits for the process to end on its own (a crash point) and
// reports how it ended.
func (c *childServer) waitExit(t *testing.T, d time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-c.exited:
		return c.cmd.ProcessState
	case <-time.After(d):
		t.Fatalf("the server did not exit within %s", d)
		return nil
	}
}

func startChild(t *testing.T, env map[string]string) *childServer {
	t.Helper()
	testenv.SkipIfShort(t, "runs the app in a child process")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// The child dies with the test binary, even when no cleanup runs (a
	// package out of time panics): a stress run found one serving on, alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(), "IDEMLAB_CHILD=1", "IDEMLAB_CHILD_ARGS=serve", "DEMO_MODE=true",
		"NATS_URL="+testenv.NATSURL(t)) // the test's, which outlives the child
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = testLogWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if _, url, ok := strings.Cut(sc.Text(), "listening on "); ok {
				found <- strings.TrimSpace(url)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case url := <-found:
		return &childServer{URL: url, cmd: cmd, exited: exited}
	case <-time.After(60 * time.Second):
		t.Fatal("child server did not start within 60s")
	}
	return nil
}

// Two server processes share one database and one provider. One is killed
// with SIGKILL while its cancellations wait on a slow provider; the other
// finishes every one of them within lease + interval + polling, and the
// invariants hold.
func TestRealCrashAnotherInstanceFinishesEveryOperation(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()

	// The provider runs in the test, outside both servers, as in compose.
	prov, provURL := externalProvider(t, db)

	const (
		lease        = time.Second
		interval     = 100 * time.Millisecond
		pollInterval = 200 * time.Millisecond
		maxPolls     = 5
		slow         = 4 * time.Second
	)
	common := map[string]string{
		"DATABASE_URL": db.URL, "ADDR": "127.0.0.1:0", "PROVIDER_URL": provURL, "PAYMENTS_ADDR": "127.0.0.1:0",
		"SESSION_SECRET": "s", "LOG_LEVEL": "warn", "DB_MAX_CONNS": "6",
		"OPERATION_LEASE": lease.String(), "RECOVERY_INTERVAL": interval.String(),
		"RECOVERY_POLL_INTERVAL": pollInterval.String(), "RECOVERY_MAX_POLLS": fmt.Sprint(maxPolls),
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	// app-1 waits for the provider longer than it is slow: its requests are
	// all in flight when it dies. app-2 is the survivor.
	victim := startChild(t, with(map[string]string{"INSTANCE_ID": "app-1", "PROVIDER_TIMEOUT": "10s"}))
	survivor := startChild(t, with(map[string]string{"INSTANCE_ID": "app-2", "PROVIDER_TIMEOUT": "500ms"}))

	f := fake.DefaultFault()
	f.Mode, f.SlowMS = fake.ModeSlow, int(slow.Milliseconds())
	if _, err := prov.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}

	// Every customer cancels every policy, at once, on app-1.
	type target struct{ token, path string }
	var targets []target
	rows, err := db.Pool.Query(ctx, `SELECT 'demo-' || u.name, p.id FROM policies p JOIN users u ON u.id = p.user_id ORDER BY p.id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tok string
		var id int64
		rows.Scan(&tok, &id)
		targets = append(targets, target{tok, fmt.Sprintf("/api/v1/policies/%d/cancel", id)})
	}
	if rows.Err() != nil || len(targets) < 5 {
		t.Fatalf("policies: %d (%v)", len(targets), rows.Err())
	}
	client := noRedirectClient(nil)
	client.Timeout = 20 * time.Second
	var wg sync.WaitGroup
	for i, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := newRequest("POST", victim.URL+tg.path, tg.token, fmt.Sprintf("crash-%d", i))
			if resp, err := client.Do(req); err == nil { // the connection dies with the process
				resp.Body.Close()
			}
		}()
	}
	// Wait until every operation is recorded and its provider call in flight…
	waitUntil(t, 10*time.Second, func() bool {
		var n int
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.requests`).Scan(&n)
		return n == len(targets)
	})
	// …then pull the plug.
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	wg.Wait()

	// On a loaded machine a few calls may have come back before the kill;
	// the rest died with the process.
	var live, atCrash int
	db.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&atCrash)
	if atCrash == 0 {
		t.Fatalf("no operation was in flight at the crash")
	}

	// Bound (invariant 6): the dead owner's lease, a pass, then polling
	// (plus one lease of slack for the calls in between, and the test
	// machine's own slowness).
	var polling time.Duration
	for n := range maxPolls {
		polling += pollInterval << n
	}
	bound := lease + interval + polling + lease + 2*time.Second
	waitUntil(t, bound+10*time.Second, func() bool {
		db.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status IN ('IN_PROGRESS', 'RECOVERING')`).Scan(&live)
		return live == 0
	})
	var lastFinished time.Time
	db.Pool.QueryRow(ctx, `SELECT max(finished_at) FROM operations`).Scan(&lastFinished)
	elapsed := lastFinished.Sub(killed)
	t.Logf("crash → last operation finished: %s for %d operations in flight (bound %s; provider slow %s)", elapsed.Round(time.Millisecond), atCrash, bound, slow)
	if elapsed > bound {
		t.Errorf("finishing took %s, beyond the bound %s", elapsed, bound)
	}

	var succeeded, byApp2 int
	db.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status = 'SUCCEEDED'`).Scan(&succeeded)
	db.Pool.QueryRow(ctx, `SELECT count(DISTINCT operation_id) FROM operation_events WHERE to_status = 'SUCCEEDED' AND actor = 'recovery on app-2'`).Scan(&byApp2)
	if succeeded != len(targets) || byApp2 != atCrash {
		t.Errorf("succeeded %d of %d, finished by app-2 %d of %d in flight", succeeded, len(targets), byApp2, atCrash)
	}
	// Invariants 1–4 and 6 (the bound), checked with the app's own SQL.
	if r, err := invariants.Check(ctx, db.Pool, invariants.Options{StaleAfter: bound}); err != nil || !r.OK {
		t.Errorf("invariants: %+v (%v)", r.Violations, err)
	}
	// Invariant 5 on the survivor: a completed key replays the identical answer.
	first := survivor.do(t, "POST", targets[0].path, targets[0].token, "after-crash")
	again := survivor.do(t, "POST", targets[0].path, targets[0].token, "after-crash")
	if first.Status != 409 || again.Status != first.Status || string(again.Body) != string(first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %s then %d %s", first.Status, first.Body, again.Status, again.Body)
	}
}

func (c *childServer) do(t *testing.T, method, path, token, key string) response {
	t.Helper()
	return doWith(t, noRedirectClient(nil), c.URL, request{Method: method, Path: path, Token: token,
		Header: map[string]string{"Idempotency-Key": key}})
}

func waitUntil(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %s", d)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func newRequest(method, url, token, key string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Idempotency-Key", key)
	return req, nil
}

// The Recovery page shows recovery at work on everyone's operations, but
// another customer's only as recovery sees it (the fresh reader's finding
// 9: signed out, every customer's operations were listed with their policy,
// their errors and each step's story, while their policy pages answer 404
// to anyone else). Alice reads her own; bob and a visitor read
// "another customer's", unlinked, without the details.
func TestRecoveryPageKeepsOthersOperationsTheirs(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"EVENTS_WORKERS": "off", "PROVIDER_TIMEOUT": "300ms", "RECOVERY_INTERVAL": "100ms",
		"RECOVERY_MAX_ATTEMPTS": "100", "RECOVERY_MAX_BACKOFF": "60s"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode = fake.ModeDrop })
	policy := s.policyOf(t, "demo-alice", 0)
	var op operationJSON
	s.do(cancelReq(policy, "demo-alice", "theirs", "")).JSON(t, &op)
	link := fmt.Sprintf(`href="/operations/%d"`, op.ID)
	alice := s.browserClient()
	s.signIn(t, alice, "alice")
	var own string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		own = string(doWith(t, alice, s.URL, request{Method: "GET", Path: "/recovery"}).Body)
		if strings.Contains(own, `data-testid="recent-recoveries"`) && strings.Contains(own, `data-testid="live-operations"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recovery never showed the operation at work:\n%s", own)
		}
	}
	if !strings.Contains(own, link) || strings.Contains(own, `data-testid="theirs"`) {
		t.Errorf("alice does not read her own operation on /recovery")
	}
	bob := s.browserClient()
	s.signIn(t, bob, "bob")
	visitor := s.browserClient()
	for who, client := range map[string]*http.Client{"bob": bob, "a visitor": visitor} {
		page := string(doWith(t, client, s.URL, request{Method: "GET", Path: "/recovery"}).Body)
		if strings.Contains(page, link) || strings.Contains(page, fmt.Sprintf("policy %d", policy)) || !strings.Contains(page, `data-testid="theirs"`) ||
			strings.Contains(page, "provider_cancel sent") || strings.Contains(page, "no answer") {
			t.Errorf("%s reads alice's operation on /recovery:\n%s", who, page)
		}
	}
}
