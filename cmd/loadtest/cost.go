package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// What the measured window cost, per answered operation (-cost-pids and
// -vacuum, docs/performance.md): the CPU of the app, of each fake and of the
// database server, and the database's buffers and WAL. Throughput says how
// fast; this says what each operation cost the machine, which a loaded
// machine changes far less — and it keeps the app's own Go CPU apart from
// the fakes', which stand for other systems.

// cost is the report's per-operation figures.
type cost struct {
	Ops        int64              `json:"ops"`         // 2xx answers in the window
	CPUms      map[string]float64 `json:"cpu_ms"`      // per process name (-cost-pids)
	Buffers    float64            `json:"buffers"`     // shared buffers hit + read
	WALRecords float64            `json:"wal_records"` // the whole server's WAL
	WALBytes   float64            `json:"wal_bytes"`
}

// costSample is the counters at one moment.
type costSample struct {
	cpu        map[string]map[int]int64 // name → pid → CPU ticks (user + system)
	buffers    int64
	walRecords int64
	walBytes   int64
}

// parseCostPids reads "app=123,provider=456,postgres=789": for postgres,
// the postmaster, whose children (every backend) are counted with it.
func parseCostPids(s string) (map[string]int, error) {
	pids := map[string]int{}
	if s == "" {
		return pids, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, pid, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(pid)
		if !ok || name == "" || err != nil || n <= 0 {
			return nil, fmt.Errorf("-cost-pids: %q is not name=pid", part)
		}
		pids[name] = n
	}
	return pids, nil
}

// sampleCPU reads the CPU ticks of each named process — and of its children
// (a database server's backends); a child that exits within the window takes
// its ticks with it, which pooled connections seldom do.
func sampleCPU(pids map[string]int) map[string]map[int]int64 {
	children := map[int][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	ticks := map[int]int64{}
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid … utime(14) stime(15): comm may hold spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		pid, _ := strconv.Atoi(strings.Fields(s[:i])[0])
		fields := strings.Fields(s[i+1:]) // state is fields[0]
		if len(fields) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		u, _ := strconv.ParseInt(fields[11], 10, 64)
		st, _ := strconv.ParseInt(fields[12], 10, 64)
		ticks[pid] = u + st
		children[ppid] = append(children[ppid], pid)
	}
	out := map[string]map[int]int64{}
	for name, pid := range pids {
		m := map[int]int64{}
		if t, ok := ticks[pid]; ok {
			m[pid] = t
		}
		for _, c := range children[pid] {
			m[c] = ticks[c]
		}
		out[name] = m
	}
	return out
}

// sampleDB reads the database's buffers and the server's WAL.
func sampleDB(ctx context.Context, databaseURL string, s *costSample) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, `
		SELECT (SELECT blks_hit + blks_read FROM pg_stat_database WHERE datname = current_database()),
		       wal_records, wal_bytes::bigint
		  FROM pg_stat_wal`).Scan(&s.buffers, &s.walRecords, &s.walBytes)
}

// statsSettle is how long the database's counters take to include a
// window's last transactions: a busy backend reports its statistics at most
// once a second, an idle one within PGSTAT_IDLE_INTERVAL (10 s, PostgreSQL 15).
const statsSettle = 11 * time.Second

// costOf is the window's cost per op from the samples at its start and end.
func costOf(start, end costSample, ops int64) *cost {
	if ops <= 0 {
		return nil
	}
	hz := 100.0 // USER_HZ: Linux reports CPU in hundredths of a second
	c := &cost{Ops: ops, CPUms: map[string]float64{}}
	for name, pids := range end.cpu {
		var ticks int64
		for pid, t := range pids {
			ticks += t - start.cpu[name][pid] // 0 for a process born in the window
		}
		c.CPUms[name] = float64(ticks) / hz * 1000 / float64(ops)
	}
	c.Buffers = float64(end.buffers-start.buffers) / float64(ops)
	c.WALRecords = float64(end.walRecords-start.walRecords) / float64(ops)
	c.WALBytes = float64(end.walBytes-start.walBytes) / float64(ops)
	return c
}
