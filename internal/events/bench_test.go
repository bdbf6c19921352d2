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
		bd = setupNATS(b, sharedNATS, events.NATSConfig{})
	} else {
		bd = setupRiver(b)
	}
	ctx := context.Background()
	for written := 0; written < n; written += 100 {
		err := pgx.BeginFunc(ctx, bd.db.Pool, func(tx pgx.Tx) error {
			for i := written; i < min(written+100, n); i++ {
				if _, err := events.Write(ctx, tx, events.NewPolicyCancelled(events.PolicyCancelled{
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
		if applied == 2*n {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatalf("after 5 minutes %d of %d pairs applied", applied, 2*n)
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
