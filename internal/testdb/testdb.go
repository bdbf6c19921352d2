// Package testdb gives each test a fresh PostgreSQL database cloned from a
// migrated template, on the server at DATABASE_URL.
//
// Cloning (CREATE DATABASE … TEMPLATE) copies a migrated schema in tens of
// milliseconds, so tests run against real PostgreSQL with committed rows — the
// races and crashes idemlab tests need cannot be tested inside a rolled-back
// transaction.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/migrations"
)

// DefaultURL is used when DATABASE_URL is unset; it matches the Makefile.
const DefaultURL = "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"

// PoolSize bounds each test database's own pool (DB.Pool). The suite's
// budget is 60 connections on the shared server (docs/testing.md): a test
// holds this many at most, a server it starts its own DB_MAX_CONNS more.
const PoolSize = 8

// namePrefix starts every test database's name; the rest is its creation
// time (Unix seconds) and a random suffix.
const namePrefix = "idemlab_test_"

// DB is one fresh database: its URL (for starting a server process against
// it) and a pool for the test's own queries.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// New creates a database for this test from the migrated template and drops it
// when the test ends. It fails the test (it does not skip) when PostgreSQL is
// unreachable: a suite that silently skips proves nothing.
func New(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	admin := adminURL()
	tpl, err := template(ctx, admin)
	if err != nil {
		t.Fatalf("testdb: template: %v", err)
	}
	// The name carries its creation time: a later run drops the leftovers
	// of a killed one (sweepLeftovers) by age, never a live database.
	name := fmt.Sprintf("%s%d_%s", namePrefix, time.Now().Unix(), randomHex(6))
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testdb: connect %s: %v", redact(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tpl)); err != nil {
		t.Fatalf("testdb: create %s: %v", name, err)
	}
	db := &DB{Name: name, URL: withDatabase(admin, name)}
	t.Cleanup(func() { drop(admin, name) })

	pool, err := database.Open(ctx, db.URL, PoolSize)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	db.Pool = pool
	return db
}

func adminURL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

var (
	tplOnce sync.Once
	tplName string
	tplErr  error
)

// template returns the name of a migrated template database, creating it once.
// Its name carries a hash of the migrations, so a changed schema gets a new
// template, and an advisory lock serialises test processes (go test runs
// packages in parallel) that would otherwise create it together.
func template(ctx context.Context, admin string) (string, error) {
	tplOnce.Do(func() { tplName, tplErr = createTemplate(ctx, admin) })
	return tplName, tplErr
}

func createTemplate(ctx context.Context, admin string) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "idemlab_tpl_" + sum[:12]
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect %s: %w", redact(admin), err)
	}
	defer conn.Close(ctx)
	sweepLeftovers(ctx, conn, namePrefix, processStart.Add(-time.Minute))
	// pg_advisory_lock is per session: held until unlock or disconnect.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(727001)`); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(727001)`)

	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	// A half-built template from a killed run is not marked datistemplate: rebuild it.
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name)); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s`, name)); err != nil {
		return "", err
	}
	pool, err := database.Open(ctx, withDatabase(admin, name), 2)
	if err != nil {
		return "", err
	}
	m, err := database.NewMigrator(pool, nil)
	if err == nil {
		err = m.Up(ctx)
		m.Close()
	}
	pool.Close()
	if err != nil {
		return "", err
	}
	// Marking it a template forbids connections that would block cloning.
	if _, err := conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`, name)); err != nil {
		return "", err
	}
	return name, nil
}

func migrationsHash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	// River's schema is a Go migration (internal/database/river.go).
	fmt.Fprintf(h, "river\x00%d\x00%d\x00", database.RiverMigrationVersion, database.RiverVersion())
	return hex.EncodeToString(h.Sum(nil)), err
}

// processStart is when this test binary started: a test database older
// than it, with nobody connected, is a leftover of a run that was killed
// before its cleanups ran (go test -timeout, a SIGKILL).
var processStart = time.Now()

// sweepLeftovers drops the test databases earlier runs left behind:
// created before `before` (processStart less a minute's margin for a clock
// step) and with no session on them — another run's live databases always
// have their test's pool connected. Best effort: a failure leaves them for
// the next run.
//
// Two namings after prefix (namePrefix; a test sweeps a prefix of its
// own): <unix seconds>_<hex> says its age in its name; the older <12 hex>
// (before the tiers) does not, so its age is its directory's PG_VERSION,
// written when the database was created (pg_stat_file: a superuser's, as
// the tests' role is; for any other role the query fails and those are
// left alone).
func sweepLeftovers(ctx context.Context, conn *pgx.Conn, prefix string, before time.Time) {
	var leftovers []string
	rows, err := conn.Query(ctx, `
		SELECT d.datname
		FROM pg_database d
		WHERE starts_with(d.datname, $1)
		  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`, prefix)
	if err == nil {
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, name := range names {
			created, _, ok := strings.Cut(strings.TrimPrefix(name, prefix), "_")
			unix, err := strconv.ParseInt(created, 10, 64)
			if ok && err == nil && time.Unix(unix, 0).Before(before) {
				leftovers = append(leftovers, name)
			}
		}
	}
	rows, err = conn.Query(ctx, `
		SELECT d.datname
		FROM pg_database d
		WHERE d.datname ~ ('^' || $1 || '[0-9a-f]{12}$')
		  -- missing_ok: a database in another tablespace has no base/ folder (NULL: kept)
		  AND (pg_stat_file('base/' || d.oid || '/PG_VERSION', true)).modification < $2
		  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`, prefix, before)
	if err == nil {
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		leftovers = append(leftovers, names...)
	}
	for _, name := range leftovers {
		// Without FORCE: a session that arrived since the query keeps it.
		conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize())
	}
}

func drop(admin, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	// FORCE: a server under test may still hold connections (a killed process's
	// sockets linger until the backend notices).
	conn.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
}

func withDatabase(raw, name string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Path = "/" + name
	return u.String()
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "DATABASE_URL"
	}
	return u.Redacted()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return strings.ToLower(hex.EncodeToString(b))
}
