// Package pgcluster runs a private PostgreSQL server in a folder of its own,
// so a test or the chaos tool can restart it, crash it or take it away
// without disturbing anyone else's database.
//
// The machine's PostgreSQL on 5432 is shared by every test package running
// at once; restarting it would break them all. A cluster here is made with
// Debian's server binaries (/usr/lib/postgresql/<version>/bin: initdb and
// postgres), listens on a free port on 127.0.0.1 with trust authentication,
// and keeps fsync on: a crash test against a server that does not flush its
// log would prove nothing about durability.
//
// The postmaster is a child of this process, not a daemon: it is started
// with a parent-death signal, so a test binary that is killed takes its
// cluster with it instead of leaving a server running on a random port.
//
// PostgreSQL refuses to run as root. When this process is root (a clean CI
// machine runs tests as root), the server binaries run as an unprivileged
// user — "postgres" unless Options.User says otherwise — in a folder that
// user owns.
package pgcluster

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// DebianRoot is where Debian installs one folder of server binaries per
// PostgreSQL major version.
const DebianRoot = "/usr/lib/postgresql"

// Options tune a cluster. The zero value is a cluster on a free port in a
// new temporary folder, with autovacuum on.
type Options struct {
	// BinDir holds initdb, postgres and pg_ctl. Default: the newest
	// /usr/lib/postgresql/<version>/bin.
	BinDir string
	// Dir is the cluster's folder (data, socket, log); it is created if
	// missing and removed by Close only when pgcluster created it.
	// Default: a new folder under os.TempDir().
	Dir string
	// Port to listen on; 0 picks a free one.
	Port int
	// User runs the server binaries when this process is root (PostgreSQL
	// refuses root). Default "postgres". Ignored when not root.
	User string
	// DisableAutovacuum stops the autovacuum launcher, so nothing but the
	// test's own statements consumes transaction ids or touches tables.
	DisableAutovacuum bool
	// Settings are extra postgresql.conf lines (name → value, quoted as
	// needed by the caller: "'on'" or "100").
	Settings map[string]string
	// StartTimeout bounds how long Start waits for the server to accept
	// connections (crash recovery included). Default 60 s.
	StartTimeout time.Duration
}

// Cluster is one running (or stopped) private PostgreSQL server.
type Cluster struct {
	opts    Options
	dir     string // the cluster's folder
	data    string // dir/data: PGDATA
	logPath string // dir/server.log: the server's stderr, across restarts
	ownsDir bool
	cred    *syscall.Credential // nil: run as this process's user
	port    int

	mu   sync.Mutex
	proc *exec.Cmd     // the running postmaster; nil while stopped
	done chan struct{} // closed when proc has exited
}

// Start creates a cluster (initdb) and starts its server. The error says
// what is missing when the binaries or the unprivileged user are not there.
func Start(opts Options) (*Cluster, error) {
	var err error
	if opts.BinDir == "" {
		if opts.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	for _, bin := range []string{"initdb", "postgres", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, bin)); err != nil {
			return nil, fmt.Errorf("pgcluster: %s not found in %s (install Debian's postgresql server package): %w", bin, opts.BinDir, err)
		}
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = time.Minute
	}
	c := &Cluster{opts: opts}
	if os.Geteuid() == 0 {
		if c.cred, err = unprivileged(cmp.Or(opts.User, "postgres")); err != nil {
			return nil, err
		}
	}
	if err := c.makeDir(); err != nil {
		return nil, err
	}
	if err := c.initdb(); err != nil {
		c.removeDir()
		return nil, err
	}
	// A free port can be taken by someone else between choosing it and
	// the server binding it: choose again a few times.
	for attempt := 0; ; attempt++ {
		if c.port = opts.Port; c.port == 0 {
			if c.port, err = freePort(); err != nil {
				c.removeDir()
				return nil, err
			}
		}
		err = c.Start()
		if err == nil || opts.Port != 0 || attempt == 4 || !strings.Contains(c.logTail(2000), "could not bind") {
			break
		}
	}
	if err != nil {
		c.removeDir()
		return nil, err
	}
	return c, nil
}

// FindBinDir returns the newest /usr/lib/postgresql/<version>/bin that has
// initdb, or an error naming what to install.
func FindBinDir() (string, error) {
	entries, _ := os.ReadDir(DebianRoot)
	var versions []int
	for _, e := range entries {
		v, err := strconv.Atoi(e.Name())
		if err == nil {
			if _, err := os.Stat(filepath.Join(DebianRoot, e.Name(), "bin", "initdb")); err == nil {
				versions = append(versions, v)
			}
		}
	}
	if len(versions) == 0 {
		return "", fmt.Errorf("pgcluster: no PostgreSQL server binaries in %s/<version>/bin (apt-get install postgresql)", DebianRoot)
	}
	return filepath.Join(DebianRoot, strconv.Itoa(slices.Max(versions)), "bin"), nil
}

// URL is a connection URL for the cluster's postgres database.
func (c *Cluster) URL() string { return c.URLFor("postgres") }

// URLFor is a connection URL for database name on this cluster.
func (c *Cluster) URLFor(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

// Port is the TCP port the server listens on (the same across restarts).
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's folder; LogPath the server's log in it.
func (c *Cluster) Dir() string     { return c.dir }
func (c *Cluster) LogPath() string { return c.logPath }

// Running reports whether the postmaster is up (it may still be starting).
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc != nil
}

// Start starts the stopped server and waits until it accepts connections
// (after crash recovery, if the last stop was immediate). Starting a
// running cluster is an error.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		return errors.New("pgcluster: already running")
	}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: open log: %w", err)
	}
	defer logf.Close() // the child keeps its own copy of the descriptor

	// The port is given on the command line, not in postgresql.conf, so a
	// retried free port needs no rewrite of the configuration.
	cmd := c.command("postgres", "-D", c.data, "-p", strconv.Itoa(c.port))
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with this process: no orphaned clusters after a
	// killed test. Pdeathsig is applied after the switch of user.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	c.proc, c.done = cmd, done

	if err := c.waitReady(done); err != nil {
		cmd.Process.Kill()
		<-done
		c.proc, c.done = nil, nil
		return fmt.Errorf("pgcluster: %w; server log ends:\n%s", err, c.logTail(1500))
	}
	return nil
}

// Stop stops the server. immediate is `pg_ctl stop -m immediate`: every
// backend is killed with no checkpoint, as in a power cut, and the next
// Start replays the write-ahead log. Otherwise it is a fast shutdown
// (sessions are ended, a checkpoint is written). Stopping a stopped
// cluster does nothing.
func (c *Cluster) Stop(immediate bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return nil
	}
	select {
	case <-c.done:
		c.proc, c.done = nil, nil
		return fmt.Errorf("pgcluster: the server had exited by itself; its log ends:\n%s", c.logTail(1500))
	default:
	}
	mode := "fast"
	if immediate {
		mode = "immediate"
	}
	out, err := c.command("pg_ctl", "stop", "-D", c.data, "-m", mode, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		// pg_ctl could not stop it (or the server already died): make sure.
		c.proc.Process.Kill()
	}
	<-c.done
	c.proc, c.done = nil, nil
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop -m %s: %w: %s", mode, err, bytes.TrimSpace(out))
	}
	return nil
}

// Restart stops the server (immediately, or with a fast shutdown) and
// starts it again, waiting until it accepts connections. Every open
// connection is cut.
func (c *Cluster) Restart(immediate bool) error {
	if err := c.Stop(immediate); err != nil {
		return err
	}
	return c.Start()
}

// StopFor takes the server away for d — connections are refused meanwhile
// — and starts it again: a database that is down, not merely restarting.
func (c *Cluster) StopFor(d time.Duration, immediate bool) error {
	if err := c.Stop(immediate); err != nil {
		return err
	}
	time.Sleep(d)
	return c.Start()
}

// Close stops the server and removes the folder if pgcluster made it.
func (c *Cluster) Close() error {
	err := c.Stop(true) // nothing is kept: no need for a checkpoint
	c.removeDir()
	return err
}

// waitReady connects until the server answers a query, the postmaster
// exits, or StartTimeout passes.
func (c *Cluster) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(c.opts.StartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.URL())
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT 1`).Scan(new(int))
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("postgres exited during start")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not accepting connections after %s: %v", c.opts.StartTimeout, err)
		}
	}
}

// makeDir creates the cluster's folder, owned by the server's user.
func (c *Cluster) makeDir() error {
	c.dir = c.opts.Dir
	if c.dir == "" {
		// os.MkdirTemp, not t.TempDir: the latter's parent is private to
		// root, and the unprivileged server user must be able to enter it.
		d, err := os.MkdirTemp("", "pgcluster-")
		if err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		c.dir, c.ownsDir = d, true
	} else if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	c.data = filepath.Join(c.dir, "data")
	c.logPath = filepath.Join(c.dir, "server.log")
	if c.cred != nil {
		if err := os.Chown(c.dir, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: give %s to the server's user: %w", c.dir, err)
		}
	}
	return nil
}

func (c *Cluster) removeDir() {
	if c.ownsDir {
		os.RemoveAll(c.dir)
	}
}

// initdb creates the data folder and appends the cluster's settings.
func (c *Cluster) initdb() error {
	// --no-sync: the freshly made files need not survive a power cut (the
	// test would be over); the server itself runs with fsync on.
	out, err := c.command("initdb", "-D", c.data, "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	settings := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": quote(c.dir),
		"fsync":                   "on",
		"synchronous_commit":      "on",
		"full_page_writes":        "on",
		"shared_buffers":          "32MB",
		"max_connections":         "100",
		"log_line_prefix":         "'%m [%p] '",
	}
	if c.opts.DisableAutovacuum {
		settings["autovacuum"] = "off"
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	return c.appendConf(settings)
}

// appendConf appends settings to postgresql.conf (later lines win).
func (c *Cluster) appendConf(settings map[string]string) error {
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	var conf strings.Builder
	conf.WriteString("\n# pgcluster\n")
	for _, k := range names {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteString(conf.String()); err != nil {
		return fmt.Errorf("pgcluster: write postgresql.conf: %w", err)
	}
	return nil
}

// command runs a server binary as the server's user, in the cluster's
// folder (the unprivileged user may not be able to enter ours).
func (c *Cluster) command(bin string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.opts.BinDir, bin), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	return cmd
}

// logTail is the end of the server's log, for error messages.
func (c *Cluster) logTail(n int) string {
	b, _ := os.ReadFile(c.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// unprivileged looks up the user the server binaries run as under root.
func unprivileged(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root and PostgreSQL refuses root; no user %q to run it as (install the postgresql package, or set Options.User): %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgcluster: user %q has a non-numeric uid or gid", name)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
