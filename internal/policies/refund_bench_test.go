package policies

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkRefundReadOnce is the round trip cut from mark_cancelled,
// publish_event and the refund's request: the policy CANCELLED and the
// refund it owes read twice after it (before), against the UPDATE that
// returns the refund (after), alternately in one run, each inside a
// transaction that rolls back. It reports the median pair's after/before.
//
//	go test -run '^$' -bench RefundReadOnce ./internal/policies/
func BenchmarkRefundReadOnce(b *testing.B) {
	db := testdb.New(b)
	ctx := context.Background()
	if _, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{Users: 1, PoliciesPerUser: 1, Slots: 1},
		time.Now(), demo.TokenFor([]byte("b"))); err != nil {
		b.Fatal(err)
	}
	var policyID int64
	if err := db.Pool.QueryRow(ctx, `SELECT min(id) FROM policies`).Scan(&policyID); err != nil {
		b.Fatal(err)
	}
	const cancel = `UPDATE policies SET status = 'CANCELLED', updated_at = now() WHERE id = $1 AND status = 'ACTIVE'`
	ways := [2]func(ctx context.Context) error{
		func(ctx context.Context) error { // before: the UPDATE, then refundOwed's SELECT for each of the two steps
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, cancel, policyID); err != nil {
				return err
			}
			for range 2 {
				if _, err := refundOwed(ctx, tx, policyID); err != nil {
					return err
				}
			}
			return nil
		},
		func(ctx context.Context) error { // after: the UPDATE returns it
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			var r refund
			return tx.QueryRow(ctx, cancel+` RETURNING `+refundColumns, policyID).Scan(&r.number, &r.cents, &r.amount)
		},
	}
	var ratios []float64
	for b.Loop() {
		var spent [2]time.Duration
		for i, f := range ways {
			start := time.Now()
			if err := f(ctx); err != nil {
				b.Fatal(err)
			}
			spent[i] = time.Since(start)
		}
		ratios = append(ratios, float64(spent[1])/float64(spent[0]))
	}
	sort.Float64s(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "after/before") // the median pair: a spike moves one pair, not it
}
