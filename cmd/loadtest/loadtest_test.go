package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/testenv"
)

// TestScenariosAgainstTheRealApp is the smoke run of `make test`: the web
// binary, built from this tree, against a fresh database; each scenario for
// a couple of seconds at low concurrency; each must end with the
// invariants ok and nothing else wrong (run returns nil: exit status 0).
func TestScenariosAgainstTheRealApp(t *testing.T) {
	testenv.SkipIfShort(t, "builds the app and runs it as a child process")
	url, _ := startApp(t)
	cases := []struct {
		scenario string
		duration string
	}{
		{"retry-storm", "2s"},
		{"double-click", "2s"},
		{"slot-race", "2s"},
		{"timeouts", "2s"},
		{"mixed", "2s"},
		{"cancel", "1s"},
		{"replay", "1s"},
		{"book", "1s"},
		{"book-free", "1s"},
		{"deposit", "2s"},
	}
	for _, tc := range cases {
		t.Run(tc.scenario, func(t *testing.T) {
			var out bytes.Buffer
			defer func() { t.Logf("%s", out.String()) }()
			err := run(t.Context(), []string{
				"-url", url, "-scenario", tc.scenario, "-duration", tc.duration,
				"-concurrency", "4", "-users", "20", "-policies-per-user", "30", "-slots", "4",
				"-settle", "45s",
			}, &out, io.Discard)
			if err != nil {
				t.Fatalf("run: %v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "invariants  ok") || !strings.HasSuffix(out.String(), "PASS\n") {
				t.Fatalf("report:\n%s", out.String())
			}
		})
	}
}

func TestAFailingRunReturnsErrFailed(t *testing.T) {
	testenv.SkipIfShort(t, "builds the app and runs it as a child process")
	// Against an address nothing listens on, the reset fails: an error, not
	// a silent pass.
	err := run(t.Context(), []string{"-url", "http://127.0.0.1:1", "-duration", "1s"}, io.Discard, io.Discard)
	if err == nil {
		t.Fatal("run against nothing passed")
	}
}

// TestAWarmupIsDrivenButNotMeasured: with -warmup the workload runs first
// and the report counts only what came after; -vacuum then vacuumed and
// analysed the app's database before the clock started.
func TestAWarmupIsDrivenButNotMeasured(t *testing.T) {
	testenv.SkipIfShort(t, "builds the app and runs it as a child process")
	url, db := startApp(t)
	var out bytes.Buffer
	err := run(t.Context(), []string{
		"-url", url, "-scenario", "cancel", "-warmup", "1s", "-vacuum", db.URL, "-duration", "1s",
		"-concurrency", "4", "-users", "20", "-policies-per-user", "30", "-json",
	}, &out, io.Discard)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	var rep report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	var measured int64
	for label, n := range rep.Answers {
		if strings.HasPrefix(label, "2") {
			measured += n
		}
	}
	var cancelled int64
	var vacuumed bool
	q := `SELECT (SELECT count(*) FROM policies WHERE status = 'CANCELLED'),
	             (SELECT last_vacuum IS NOT NULL AND last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE schemaname = 'public' AND relname = 'operations')`
	if err := db.Pool.QueryRow(t.Context(), q).Scan(&cancelled, &vacuumed); err != nil {
		t.Fatal(err)
	}
	if rep.Warmup != 1 || !rep.Pass || measured == 0 {
		t.Fatalf("report: warmup %v, pass %v, %d answers 2xx", rep.Warmup, rep.Pass, measured)
	}
	// Every cancellation is one policy cancelled; the report saw only some.
	if cancelled <= measured {
		t.Errorf("%d policies cancelled, %d answers 2xx reported: the warm-up's were counted, or there was none", cancelled, measured)
	}
	if !vacuumed {
		t.Error("operations was not vacuumed and analysed")
	}
}

// startApp builds cmd/web and runs `web serve` on free loopback ports
// against a fresh database, and returns its base URL and the database.
// The process is stopped when the test ends.
func startApp(t *testing.T) (string, *testdb.DB) {
	t.Helper()
	db := testdb.New(t)
	bin := testenv.AppBinary(t)
	cmd := exec.Command(bin, "serve")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test binary, cleanup or not
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+db.URL,
		"ADDR=127.0.0.1:0",
		"PROVIDER_ADDR=127.0.0.1:0",
		"PAYMENTS_ADDR=127.0.0.1:0",
		"DEMO_MODE=true",
		// the load generator's host: its writes are not rate limited
		"RATE_LIMIT_EXEMPT=127.0.0.1",
		"SESSION_SECRET=loadtest-smoke-secret-0123456789abcdef",
		"LOG_LEVEL=warn",
		// a dropped provider call costs this, not 2 s
		"PROVIDER_TIMEOUT=1s",
		"PAYMENTS_TIMEOUT=1s",
		// recovery drains what the timeouts scenario leaves in seconds
		"OPERATION_LEASE=2s",
		"RECOVERY_INTERVAL=200ms",
		"RECOVERY_POLL_INTERVAL=100ms",
		"INSTANCE_ID=smoke",
	)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("web stderr:\n%s", stderr.String())
		}
	})

	// The banner says where it listens (ADDR port 0: the kernel chose).
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "idemlab listening on "); ok {
				found <- strings.TrimSpace(rest)
			}
		}
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	select {
	case url := <-found:
		return url, db
	case err := <-exited:
		exited <- err
		t.Fatalf("web exited before listening: %v\n%s", err, stderr.String())
	case <-ctx.Done():
		t.Fatalf("web did not start in time\n%s", stderr.String())
	}
	return "", nil
}

// syncBuffer is a bytes.Buffer safe for the process's writes and our read.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
