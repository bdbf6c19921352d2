// Package cluster is the chaos run's own PostgreSQL: a private cluster
// (internal/pgcluster) in the run's folder, so that restarting it — the
// nemesis does, dozens of times — disturbs nothing else on the machine.
//
// It adds to pgcluster what the nemesis needs: one lock so a restart and a
// stop never overlap, and the two ways a database goes away — an
// immediate restart (every connection cut, the write-ahead log replayed)
// and a stop that lasts, during which connections are refused.
package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/pgcluster"
)

// DB is the run's database server, and with -failover its synchronous
// standby.
type DB struct {
	pg      *pgcluster.Cluster
	standby *pgcluster.Cluster // nil: no failover in this run
	url     string
	runDir  string
	mu      sync.Mutex // one disturbance at a time
	gone    int        // primaries lost to a failover, for their logs' names
}

// settings are every server's: enough connections for the app instances,
// the fakes and the tool itself, with room for the ones a killed process
// leaves behind until the server notices.
var settings = map[string]string{"max_connections": "200"}

// Start creates the cluster in a temporary folder (one the unprivileged
// server user can enter, wherever the run's folder is); Close copies its
// log into runDir. Enough connections for two app instances, the fakes
// and the tool itself, with room for the ones a killed process leaves
// behind until the server notices.
//
// withStandby adds a synchronous streaming standby (docs/scaling.md), and
// URL lists both servers with target_session_attrs=read-write: Failover
// kills the primary and promotes the standby under the processes' feet.
func Start(runDir string, withStandby bool) (*DB, error) {
	primary := map[string]string{}
	for k, v := range settings {
		primary[k] = v
	}
	if withStandby {
		for k, v := range pgcluster.Synchronous {
			primary[k] = v
		}
	}
	pg, err := pgcluster.Start(pgcluster.Options{Settings: primary})
	if err != nil {
		return nil, err
	}
	d := &DB{pg: pg, runDir: runDir, url: pg.URL()}
	if withStandby {
		if d.standby, err = pgcluster.StartStandby(pg, pgcluster.Options{Settings: settings}); err != nil {
			pg.Close()
			return nil, err
		}
		d.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			pg.Port(), d.standby.Port())
	}
	return d, nil
}

// URL is the DATABASE_URL every process uses.
func (d *DB) URL() string { return d.url }

// Failover kills the primary (an immediate stop: a crash), promotes the
// standby and, so the next failover finds one, makes a new synchronous
// standby of the new primary on the old primary's port — the URL stays
// right. It returns how long no primary answered. Between the promotion
// and the new standby's first stream the primary commits alone.
func (d *DB) Failover() (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.standby == nil {
		return 0, errors.New("cluster: no standby (run with -failover)")
	}
	start := time.Now()
	if err := d.pg.Stop(true); err != nil {
		return time.Since(start), fmt.Errorf("cluster: kill the primary: %w", err)
	}
	if err := d.standby.Promote(); err != nil {
		return time.Since(start), fmt.Errorf("cluster: promote: %w", err)
	}
	away := time.Since(start)
	// Alone now: stop waiting for a standby until the new one streams.
	if err := d.standby.SetSynchronous(false); err != nil {
		return away, err
	}
	old := d.pg
	d.pg, d.standby = d.standby, nil
	d.gone++
	if log, err := os.ReadFile(old.LogPath()); err == nil {
		os.WriteFile(filepath.Join(d.runDir, fmt.Sprintf("postgres-%d.log", d.gone)), log, 0o644)
	}
	old.Close()
	standby, err := pgcluster.StartStandby(d.pg, pgcluster.Options{Port: old.Port(), Settings: settings})
	if err != nil {
		return away, fmt.Errorf("cluster: a new standby: %w", err)
	}
	d.standby = standby
	if err := d.pg.SetSynchronous(true); err != nil {
		return away, err
	}
	return away, nil
}

// RestartImmediately is `pg_ctl restart -m immediate`: no checkpoint,
// every backend killed, crash recovery on the way up. It returns how long
// the server was away.
func (d *DB) RestartImmediately() (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	if err := d.pg.Restart(true); err != nil {
		return time.Since(start), fmt.Errorf("cluster: restart: %w", err)
	}
	return time.Since(start), nil
}

// DownFor stops the server immediately, keeps it down for down (every
// connection attempt is refused) and starts it again.
func (d *DB) DownFor(down time.Duration) (time.Duration, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	if err := d.pg.StopFor(down, true); err != nil {
		return time.Since(start), fmt.Errorf("cluster: down for %s: %w", down, err)
	}
	return time.Since(start), nil
}

// EnsureUp starts the server if a failed disturbance left it stopped.
func (d *DB) EnsureUp() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pg.Running() {
		return nil
	}
	return d.pg.Start()
}

// Close stops the server, keeps its log as runDir/postgres.log and
// removes the cluster.
func (d *DB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.pg.Stop(false)
	if log, rerr := os.ReadFile(d.pg.LogPath()); rerr == nil {
		os.WriteFile(filepath.Join(d.runDir, "postgres.log"), log, 0o644)
	}
	if d.standby != nil {
		err = errors.Join(err, d.standby.Close())
	}
	return errors.Join(err, d.pg.Close())
}
