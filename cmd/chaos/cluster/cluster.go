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

// DB is the run's database server.
type DB struct {
	pg     *pgcluster.Cluster
	runDir string
	mu     sync.Mutex // one disturbance at a time
}

// Start creates the cluster in a temporary folder (one the unprivileged
// server user can enter, wherever the run's folder is); Close copies its
// log into runDir. Enough connections for two app instances, the fakes
// and the tool itself, with room for the ones a killed process leaves
// behind until the server notices.
func Start(runDir string) (*DB, error) {
	pg, err := pgcluster.Start(pgcluster.Options{
		Settings: map[string]string{"max_connections": "200"},
	})
	if err != nil {
		return nil, err
	}
	return &DB{pg: pg, runDir: runDir}, nil
}

// URL is the DATABASE_URL every process uses.
func (d *DB) URL() string { return d.pg.URL() }

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
	return errors.Join(err, d.pg.Close())
}
