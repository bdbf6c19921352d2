package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// A standby here is PostgreSQL's own streaming replication: a copy of the
// primary made with pg_basebackup that replays the primary's write-ahead
// log as it streams in, and that Promote turns into a primary. Which
// commits a failover can lose is decided on the primary: with
// synchronous_standby_names naming the standby and synchronous_commit = on,
// a commit returns only once the standby has flushed its log; without, the
// standby trails by whatever the network had not carried yet.

// StandbyName is the application_name a standby connects with: the name the
// primary's synchronous_standby_names lists to wait for it.
const StandbyName = "standby"

// Synchronous are the primary's settings that make every commit wait until
// StandbyName has the commit on disk (synchronous_commit = on: flushed, not
// merely received — "remote_write" would lose a commit to a standby's
// operating-system crash; "remote_apply" would also wait for the replay,
// which only readers of the standby need, and idemlab never reads from it).
var Synchronous = map[string]string{
	"synchronous_standby_names": quote(StandbyName),
	"synchronous_commit":        "on",
}

// StandbyBinaries are the server binaries a primary with a streaming
// standby needs: Start's and StartStandby's.
var StandbyBinaries = []string{"initdb", "postgres", "pg_ctl", "pg_basebackup"}

// Check says what this machine lacks to run a primary and a streaming
// standby with the binaries in binDir ("" = the newest Debian folder, as
// Start picks it): nil when nothing, else an error naming every missing
// binary and where it was looked for — or, as root, the missing user the
// server would run as. It starts nothing.
func Check(binDir string) error {
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return fmt.Errorf("pgcluster: %s missing: no %s/<version>/bin holds them (Debian's postgresql package)",
				strings.Join(StandbyBinaries, ", "), DebianRoot)
		}
	}
	var missing []string
	for _, bin := range StandbyBinaries {
		if _, err := os.Stat(filepath.Join(binDir, bin)); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("pgcluster: %s missing from %s (Debian's postgresql package)", strings.Join(missing, ", "), binDir)
	}
	if os.Geteuid() == 0 {
		if _, err := unprivileged("postgres"); err != nil {
			return err
		}
	}
	return nil
}

// StartStandby copies primary with pg_basebackup into a cluster of its own
// and starts it streaming from primary. opts.Settings apply to the standby
// (on top of the primary's configuration, which the copy carries); the
// standby never waits for a standby of its own, so once promoted it takes
// writes alone.
func StartStandby(primary *Cluster, opts Options) (*Cluster, error) {
	if opts.BinDir == "" {
		opts.BinDir = primary.opts.BinDir
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = time.Minute
	}
	c := &Cluster{opts: opts, cred: primary.cred}
	if err := c.makeDir(); err != nil {
		return nil, err
	}
	out, err := c.command("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", c.data, "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput()
	if err != nil {
		c.removeDir()
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %w: %s", err, bytes.TrimSpace(out))
	}
	settings := map[string]string{
		"primary_conninfo": quote(fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s",
			primary.port, StandbyName)),
		"synchronous_standby_names": "''",
		"hot_standby":               "on",
		"unix_socket_directories":   quote(c.dir),
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	if err := c.appendConf(settings); err != nil {
		c.removeDir()
		return nil, err
	}
	if err := c.writeFile(filepath.Join(c.data, "standby.signal"), nil); err != nil {
		c.removeDir()
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		if c.port = opts.Port; c.port == 0 {
			if c.port, err = freePort(); err != nil {
				c.removeDir()
				return nil, err
			}
		}
		err = c.Start()
		if err == nil || opts.Port != 0 || attempt == 4 {
			break
		}
	}
	if err != nil {
		c.removeDir()
		return nil, err
	}
	return c, nil
}

// Promote ends the standby's recovery (pg_ctl promote) and waits until it
// accepts writes: from then on it is a primary.
func (c *Cluster) Promote() error {
	out, err := c.command("pg_ctl", "promote", "-D", c.data, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w: %s", err, bytes.TrimSpace(out))
	}
	err = c.waitFor(func(conn *pgx.Conn) (bool, error) {
		var inRecovery bool
		err := conn.QueryRow(context.Background(), `SELECT pg_is_in_recovery()`).Scan(&inRecovery)
		return !inRecovery, err
	})
	if err != nil {
		return err
	}
	// A primary streams from nobody. A paused standby's empty
	// primary_conninfo stays in postgresql.auto.conf, which a standby
	// copied from this server would inherit over the conninfo StartStandby
	// gives it: it would never stream.
	return c.resetAndReload("primary_conninfo")
}

// CaughtUp waits until the standby has flushed everything primary has
// written so far.
func (c *Cluster) CaughtUp(primary *Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	var target string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target)
	conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.waitFor(func(conn *pgx.Conn) (bool, error) {
		var done bool
		err := conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_receive_lsn() >= $1::pg_lsn, false)`, target).Scan(&done)
		return done, err
	})
}

// SetSynchronous makes the (promoted) primary wait for StandbyName at every
// commit, or stop waiting (ALTER SYSTEM and a reload: no restart).
func (c *Cluster) SetSynchronous(on bool) error {
	names := ""
	if on {
		names = StandbyName
	}
	return c.setAndReload("synchronous_standby_names", names)
}

// setAndReload sets one server setting with ALTER SYSTEM and reloads the
// configuration: the settings replication changes need no restart.
func (c *Cluster) setAndReload(name, value string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET `+name+` = `+quote(value)); err != nil {
		return fmt.Errorf("pgcluster: set %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgcluster: reload: %w", err)
	}
	return nil
}

// resetAndReload drops one setting from postgresql.auto.conf (ALTER SYSTEM
// RESET) and reloads the configuration.
func (c *Cluster) resetAndReload(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER SYSTEM RESET `+name); err != nil {
		return fmt.Errorf("pgcluster: reset %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgcluster: reload: %w", err)
	}
	return nil
}

// PauseStreaming stops the standby receiving the primary's log (its
// primary_conninfo emptied and reloaded), as a lagging or cut-off standby
// would. A primary that waits for this standby waits, meanwhile, at every
// commit.
func (c *Cluster) PauseStreaming() error {
	return c.setConnInfo("")
}

func (c *Cluster) setConnInfo(conninfo string) error {
	if err := c.setAndReload("primary_conninfo", conninfo); err != nil {
		return err
	}
	// Paused: wait until the walreceiver is gone, so nothing more arrives.
	return c.waitFor(func(conn *pgx.Conn) (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var receiving bool
		err := conn.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_wal_receiver`).Scan(&receiving)
		return receiving == (conninfo != ""), err
	})
}

// waitFor polls done on a fresh connection until it reports true, for at
// most StartTimeout.
func (c *Cluster) waitFor(done func(*pgx.Conn) (bool, error)) error {
	deadline := time.Now().Add(c.opts.StartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, c.URL())
		ok := false
		if err == nil {
			ok, err = done(conn)
			conn.Close(ctx)
		}
		cancel()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: not there after %s: %v", c.opts.StartTimeout, cmpErr(err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("the condition still does not hold")
	}
	return err
}

// writeFile writes a file in the cluster's folder, owned by the server's user.
func (c *Cluster) writeFile(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	return nil
}
