package pgcluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/pgcluster"
)

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestCommittedRowsSurviveAnImmediateRestart(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	ctx := context.Background()
	conn := connect(t, c.URL())
	var fsync string
	if err := conn.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil || fsync != "on" {
		t.Fatalf("fsync = %q (%v), want on", fsync, err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}

	if err := c.Restart(true); err != nil {
		t.Fatalf("restart: %v", err)
	}
	// The connection from before the restart was cut.
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection opened before an immediate restart still answers")
	}
	var n int
	if err := connect(t, c.URL()).QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows after the restart: %d (%v), want 3", n, err)
	}
	// Immediate means no shutdown checkpoint: the server replayed its log.
	log, _ := os.ReadFile(c.LogPath())
	if !strings.Contains(string(log), "automatic recovery in progress") {
		t.Fatalf("the server log shows no crash recovery after an immediate restart:\n%s", log)
	}
}

func TestAStoppedClusterRefusesConnectionsUntilStarted(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	ctx := context.Background()
	port := c.Port()
	if err := c.Stop(false); err != nil {
		t.Fatal(err)
	}
	if c.Running() {
		t.Fatal("Running after Stop")
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := pgx.Connect(cctx, c.URL())
	cancel()
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to a stopped cluster: %v, want connection refused", err)
	}
	if err := c.Stop(false); err != nil {
		t.Fatalf("stopping a stopped cluster: %v", err)
	}

	start := time.Now()
	if err := c.StopFor(300*time.Millisecond, true); err != nil { // stopped already: only the wait and the start
		t.Fatal(err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Fatal("StopFor returned before its duration")
	}
	if c.Port() != port {
		t.Fatalf("port changed across restarts: %d → %d", port, c.Port())
	}
	if err := connect(t, c.URL()).Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err == nil {
		t.Fatal("Start of a running cluster succeeded")
	}
}

// The lead's commit-count test reads transaction ids on a quiet cluster:
// with autovacuum off nothing else consumes them.
func TestWithoutAutovacuumOnlyTheTestConsumesTransactionIDs(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{
		DisableAutovacuum: true,
		Settings:          map[string]string{"application_name": "'pgcluster-test'"},
	})
	ctx := context.Background()
	conn := connect(t, c.URL())
	var av, app string
	if err := conn.QueryRow(ctx, `SELECT current_setting('autovacuum'), current_setting('application_name')`).Scan(&av, &app); err != nil {
		t.Fatal(err)
	}
	if av != "off" || app != "pgcluster-test" {
		t.Fatalf("autovacuum = %q, application_name = %q: the options were not applied", av, app)
	}
	var before, after int64
	if err := conn.QueryRow(ctx, `SELECT txid_current()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := conn.QueryRow(ctx, `SELECT txid_current()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before+1 {
		t.Fatalf("transaction ids %d then %d: something else wrote to the cluster", before, after)
	}
}

func TestAsRootTheServerRunsAsAnUnprivilegedUser(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	fi, err := os.Stat(filepath.Join(c.Dir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	owner := fi.Sys().(*syscall.Stat_t).Uid
	want := uint32(os.Geteuid())
	if want == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Sscan(u.Uid, &want)
	}
	if owner != want {
		t.Fatalf("data folder owned by uid %d, want %d", owner, want)
	}
	var su bool
	if err := connect(t, c.URL()).QueryRow(context.Background(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&su); err != nil || !su {
		t.Fatalf("connected as postgres superuser: %v %v", su, err)
	}
}

func TestTwoClustersAtOnce(t *testing.T) {
	t.Parallel()
	a := pgcluster.ForTest(t, pgcluster.Options{})
	b := pgcluster.ForTest(t, pgcluster.Options{})
	if a.Port() == b.Port() || a.Dir() == b.Dir() {
		t.Fatalf("two clusters share port %d/%d or folder %s/%s", a.Port(), b.Port(), a.Dir(), b.Dir())
	}
	if err := a.Restart(true); err != nil {
		t.Fatal(err)
	}
	if err := connect(t, b.URL()).Ping(context.Background()); err != nil {
		t.Fatalf("restarting one cluster disturbed the other: %v", err)
	}
}

func TestCloseRemovesTheFolder(t *testing.T) {
	t.Parallel()
	c, err := pgcluster.Start(pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Dir()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after Close: %v", dir, err)
	}
}

// fatalTB records Fatalf instead of ending the test, to see ForTest fail.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestForTestFailsClearlyWithoutTheBinaries(t *testing.T) {
	t.Parallel()
	tb := &fatalTB{TB: t}
	if c := pgcluster.ForTest(tb, pgcluster.Options{BinDir: filepath.Join(t.TempDir(), "no-such-bin")}); c != nil {
		t.Fatal("ForTest returned a cluster without binaries")
	}
	if !strings.Contains(tb.msg, "initdb not found") || !strings.Contains(tb.msg, "postgresql") {
		t.Fatalf("ForTest's failure does not say what is missing: %q", tb.msg)
	}
}
