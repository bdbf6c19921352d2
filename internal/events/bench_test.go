package events_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/testenv"
)

// BenchmarkDrain: N events (EVENTS_BENCH_N, default 10,000) committed to
// the outbox, then relayed (NATS) or already queued (River) and applied by
// both consumers, two instances of each. It reports the time from the
// first consumer start to the last (event, consumer) pair applied, and
// events per second through both consumers. Run with -benchtime=1x:
//
//	go test -run '^$' -bench Drain -benchtime=1x ./internal/events/
//
// The writes are not timed (100 events per transaction, to set up fast).
func BenchmarkDrain(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("EVENTS_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	for _, transport := range events.Transports {
		b.Run(transport, func(b *testing.B) {
			for range b.N {
				drain(b, transport, n)
			}
		})
	}
}

func drain(b *testing.B, transport string, n int) {
	b.Helper()
	b.StopTimer()
	var bd *bundle
	if transport == events.TransportNATS {
		bd = setupNATS(b, testenv.NATSURL(b), events.NATSConfig{})
	} else {
		bd = setupRiver(b)
	}
	ctx := context.Background()
	for written := 0; written < n; written += 100 {
		err := pgx.BeginFunc(ctx, bd.db.Pool, func(tx pgx.Tx) error {
			for i := written; i < min(written+100, n); i++ {
				if _, err := outbox.Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
					PolicyID: int64(i + 1), PolicyNumber: fmt.Sprintf("P-%d", i+1), UserID: bd.userID,
					OperationID: int64(i + 1), RefundKey: fmt.Sprintf("%d:refund", i+1), RefundAmount: "1.00",
					CancelledAt: time.Now()})); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StartTimer()
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if transport == events.TransportNATS {
		relay := bd.relay(b, events.RelayConfig{Interval: 50 * time.Millisecond})
		go relay.Run(runCtx)
		bd.startConsumers(b, 2)
	} else {
		bd.startRiverConsumers(b, 2, events.RiverConfig{}, nil)
	}
	for {
		var applied int
		if err := bd.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&applied); err != nil {
			b.Fatal(err)
		}
		if applied == len(events.Consumers)*n {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("after 5 minutes %d of %d pairs applied", applied, len(events.Consumers)*n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(took.Seconds(), "s/drain")
	b.ReportMetric(float64(n)/took.Seconds(), "events/s")
	var dupMail, dupLedger int
	bd.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) - count(DISTINCT event_id) FROM mailbox),
	                                 (SELECT count(*) - count(DISTINCT event_id) FROM ledger_entries)`).Scan(&dupMail, &dupLedger)
	if dupMail != 0 || dupLedger != 0 {
		b.Fatalf("double effects: %d mailbox, %d ledger", dupMail, dupLedger)
	}
}

// BenchmarkLagAtRate: events written one per transaction (as a workflow
// writes them) at EVENTS_BENCH_RATE per second (default 250, the app's
// cancellation rate in docs/performance.md) for EVENTS_BENCH_SECONDS
// (default 10), with the relay and two instances of each consumer running.
// It reports the lag from the writer's insert to the second consumer's
// commit: p50, p99 and max.
func BenchmarkLagAtRate(b *testing.B) {
	rate, secs := 250, 10
	if v, err := strconv.Atoi(os.Getenv("EVENTS_BENCH_RATE")); err == nil && v > 0 {
		rate = v
	}
	if v, err := strconv.Atoi(os.Getenv("EVENTS_BENCH_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	for _, transport := range events.Transports {
		b.Run(transport, func(b *testing.B) {
			for range b.N {
				lagAtRate(b, transport, rate, secs)
			}
		})
	}
}

func lagAtRate(b *testing.B, transport string, rate, secs int) {
	var bd *bundle
	if transport == events.TransportNATS {
		bd = setupNATS(b, testenv.NATSURL(b), events.NATSConfig{})
	} else {
		bd = setupRiver(b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if transport == events.TransportNATS {
		go bd.relay(b, events.RelayConfig{}).Run(ctx) // the app's defaults: 1 s poll, NOTIFY wakes it
		bd.startConsumers(b, 2)
	} else {
		bd.startRiverConsumers(b, 2, events.RiverConfig{}, nil)
	}
	n := rate * secs
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		<-tick.C
		err := pgx.BeginFunc(ctx, bd.db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
				PolicyID: int64(i + 1), PolicyNumber: fmt.Sprintf("P-%d", i+1), UserID: bd.userID,
				OperationID: int64(i + 1), RefundKey: fmt.Sprintf("%d:refund", i+1), RefundAmount: "1.00",
				CancelledAt: time.Now()}))
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var applied int
		bd.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&applied)
		if applied == len(events.Consumers)*n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("a minute after the last write: %d of %d applied", applied, len(events.Consumers)*n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var p50, p99, max float64
	err := bd.db.Pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
		       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
		       max(lag)
		  FROM (SELECT extract(epoch FROM max(i.applied_at) - o.created_at) AS lag
		          FROM outbox o
		          JOIN inbox i ON i.event_id = o.id
		         GROUP BY o.id, o.created_at) l`).Scan(&p50, &p99, &max)
	if err != nil {
		b.Fatal(err)
	}
	if transport == events.TransportNATS {
		var sp99 float64
		bd.db.Pool.QueryRow(ctx, `
			SELECT max(extract(epoch FROM sent_at - created_at))
			  FROM outbox`).Scan(&sp99)
		b.ReportMetric(sp99*1000, "ms-max-relay")
	}
	if os.Getenv("EVENTS_BENCH_DEBUG") != "" {
		rows, _ := bd.db.Pool.Query(ctx, `
			SELECT i.consumer, extract(epoch FROM o.created_at - min(o.created_at) OVER ())::numeric(6,2),
			       extract(epoch FROM i.applied_at - o.created_at)::numeric(6,3)
			  FROM outbox o JOIN inbox i ON i.event_id = o.id
			 ORDER BY i.applied_at - o.created_at DESC LIMIT 15`)
		for rows.Next() {
			var c, at, lag string
			rows.Scan(&c, &at, &lag)
			b.Logf("%s written at +%ss applied after %ss", c, at, lag)
		}
	}
	b.ReportMetric(p50*1000, "ms-p50-lag")
	b.ReportMetric(p99*1000, "ms-p99-lag")
	b.ReportMetric(max*1000, "ms-max-lag")
}
