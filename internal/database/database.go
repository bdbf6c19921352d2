// Package database opens idemlab's PostgreSQL pool and applies its migrations.
//
// Every other package receives a *pgxpool.Pool (or a transaction) from here and
// writes its own SQL; this package knows nothing about policies or slots.
package database

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/idemlab/idemlab/migrations"
)

// DBTX is what a store method needs to run SQL: the pool itself or a
// transaction the caller opened, so several stores can share one commit.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Open connects a pool of at most maxConns connections and checks that the
// server answers. The pool size is explicit because it bounds how many
// transactions idemlab runs at once; see docs/performance.md.
func Open(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database: parse DATABASE_URL: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// A database that does not answer at all (a host gone, a network
		// partition) must fail a request within a bound — 503, not a hang.
		cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database: ping: %w", err)
	}
	return pool, nil
}

// Migrator applies the embedded migrations with goose's Provider API.
type Migrator struct {
	provider *goose.Provider
}

// NewMigrator prepares goose over the pool. A Postgres session locker (an
// advisory lock held for the whole run) makes replicas that start together
// apply migrations one at a time instead of racing.
func NewMigrator(pool *pgxpool.Pool, logger *slog.Logger) (*Migrator, error) {
	return newMigrator(pool, migrations.FS, logger)
}

func newMigrator(pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger) (*Migrator, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("database: session locker: %w", err)
	}
	opts := []goose.ProviderOption{goose.WithSessionLocker(locker), goose.WithGoMigrations(riverMigration())}
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, stdlib.OpenDBFromPool(pool), fsys, opts...)
	if err != nil {
		return nil, fmt.Errorf("database: goose provider: %w", err)
	}
	return &Migrator{provider: p}, nil
}

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) error {
	if _, err := m.provider.Up(ctx); err != nil {
		return fmt.Errorf("database: migrate up: %w", err)
	}
	return nil
}

// Down rolls back the most recent migration.
func (m *Migrator) Down(ctx context.Context) error {
	if _, err := m.provider.Down(ctx); err != nil {
		return fmt.Errorf("database: migrate down: %w", err)
	}
	return nil
}

// Status lists every known migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]*goose.MigrationStatus, error) {
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("database: migrate status: %w", err)
	}
	return st, nil
}

// ErrPending reports that the schema is behind the binary.
var ErrPending = errors.New("database: migrations pending")

// CheckCurrent answers nil when the database is reachable and at the latest
// version; /readyz uses it.
func (m *Migrator) CheckCurrent(ctx context.Context) error {
	current, target, err := m.provider.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("database: versions: %w", err)
	}
	if current < target {
		return fmt.Errorf("%w: at %d, want %d", ErrPending, current, target)
	}
	return nil
}

// Close releases the *sql.DB goose uses (not the pool).
func (m *Migrator) Close() error { return m.provider.Close() }
