package recovery_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/recovery/recoverytest"
	"github.com/idemlab/idemlab/internal/workflow"
)

// BenchmarkDrain is make bench's recovery drain in one process: stale
// cancellations (IN_PROGRESS, lease run out, the provider never reached —
// seeded as scripts/bench/bench.sh seeds them) drained by two loops, each
// with its own pool, engine and clients as two instances have them. It
// reports the drain rate and, counted by a tracer on the loops' pools, the
// round trips and commits one recovered operation costs: the figure that
// does not move with the machine's load.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./internal/recovery/
func BenchmarkDrain(b *testing.B) {
	const stale = 1000
	for range b.N {
		b.StopTimer()
		bn := recoverytest.Setup(b)
		seedStale(b, bn, stale)
		var trips, commits atomic.Int64
		loops := []*recovery.Loop{tracedLoop(b, bn, "app-1", &trips, &commits), tracedLoop(b, bn, "app-2", &trips, &commits)}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		b.StartTimer()
		start := time.Now()
		for _, l := range loops {
			wg.Add(1)
			go func() { defer wg.Done(); l.Run(ctx) }()
		}
		for bn.Live(b) > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(start)
		b.StopTimer()
		cancel()
		wg.Wait()
		b.ReportMetric(float64(stale)/took.Seconds(), "ops/s")
		b.ReportMetric(float64(trips.Load())/stale, "round-trips/op")
		b.ReportMetric(float64(commits.Load())/stale, "commits/op")
	}
}

// seedStale inserts n stale cancellations of alice's policies (adding
// policies as needed), the intent recorded and nothing sent.
func seedStale(b testing.TB, bn *recoverytest.Bundle, n int) {
	b.Helper()
	_, err := bn.DB.Pool.Exec(context.Background(), `
		WITH p AS (
		    INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
		    SELECT user_id, 'BENCH-' || g, holder, premium, coverage_start, coverage_end
		      FROM policies, generate_series(1, $1) AS g
		     WHERE id = $2
		    RETURNING id, user_id),
		o AS (
		    INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
		                            owner_token, owner_id, lease_expires_at)
		    SELECT id, 'CANCEL', user_id, 'bench-stale-' || id, 'IN_PROGRESS',
		           gen_random_uuid(), 'bench: a process that died', now() - interval '1 minute'
		      FROM p
		    RETURNING id)
		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, finished_at)
		SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system,
		       CASE WHEN s.position = 1 THEN 'DONE' ELSE 'PENDING' END,
		       CASE WHEN s.position = 1 THEN now() END
		  FROM o,
		       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
		               (4, 'publish_event', NULL), (5, 'refund', 'payments'), (6, 'audit', NULL)) AS s(position, name, system)`,
		n, bn.PolicyIDs[0])
	if err != nil {
		b.Fatal(err)
	}
}

// tracedLoop is a loop as `web serve` runs it (default batch and interval,
// a pool of 8), whose pool counts its round trips and commits.
func tracedLoop(b *testing.B, bn *recoverytest.Bundle, name string, trips, commits *atomic.Int64) *recovery.Loop {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(bn.DB.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = counter{trips, commits}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	client := provider.NewHTTPClient(bn.URL, bn.Timeout)
	b.Cleanup(client.CloseIdleConnections)
	pay := payments.NewHTTPClient(bn.PayURL, bn.Timeout)
	b.Cleanup(pay.CloseIdleConnections)
	engine := workflow.NewEngine(pool, workflow.Config{Lease: 30 * time.Second, Logger: recoverytest.Quiet})
	policies.NewCanceller(engine, client, pay, events.NewWriter(nil))
	rc := recovery.DefaultConfig()
	rc.Instance, rc.Logger = name, recoverytest.Quiet
	l := recovery.New(engine, rc)
	l.Register(policies.OperationCancel, engine)
	return l
}

// counter is a pgx tracer counting every statement sent (a round trip)
// and the commits among them.
type counter struct{ trips, commits *atomic.Int64 }

func (c counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.trips.Add(1)
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		c.commits.Add(1)
	}
	return ctx
}

func (counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
