package testdb

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RoundTrips counts a pool's round trips to PostgreSQL, as a pgx tracer:
// each statement sent on its own (BEGIN and COMMIT included) is one, and a
// batch is one however many statements it carries. The extra round trip of
// a statement a connection meets for the first time (pgx prepares it, then
// caches it) is counted apart, in Prepared: warm up first, and what is left
// is the steady state. Counts, not times: a test may assert them.
type RoundTrips struct {
	mu       sync.Mutex
	sent     []string // the SQL of each round trip, a batch's joined by " ⏎ "
	prepared int
}

// TracedPool opens a second pool on db whose round trips rt counts.
func (db *DB) TracedPool(t testing.TB, rt *RoundTrips) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rt
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Take returns the round trips made since the last Take, each as its SQL
// (whitespace folded), and forgets them.
func (rt *RoundTrips) Take() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	sent := rt.sent
	rt.sent, rt.prepared = nil, 0
	return sent
}

// Prepared is how many statements were prepared since the last Take.
func (rt *RoundTrips) Prepared() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.prepared
}

func (rt *RoundTrips) add(sql string) {
	rt.mu.Lock()
	rt.sent = append(rt.sent, strings.Join(strings.Fields(sql), " "))
	rt.mu.Unlock()
}

func (rt *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	rt.add(data.SQL)
	return ctx
}

func (rt *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (rt *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sqls := make([]string, len(data.Batch.QueuedQueries))
	for i, q := range data.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	rt.add(strings.Join(sqls, " ⏎ "))
	return ctx
}

func (rt *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (rt *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (rt *RoundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	rt.mu.Lock()
	rt.prepared++
	rt.mu.Unlock()
	return ctx
}

func (rt *RoundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// A COPY is one round trip (pgx streams its rows after the command without
// waiting for an answer).
func (rt *RoundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	rt.add("copy " + data.TableName.Sanitize() + " (" + strings.Join(data.ColumnNames, ", ") + ") from stdin")
	return ctx
}

func (rt *RoundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}
