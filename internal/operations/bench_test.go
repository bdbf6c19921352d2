package operations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkListDefaultView1M is issue 27's promise: the operations list's
// default view — an admin's first page of 50, newest first, with the
// counts per status at its top — answers in under 50 ms with 1,000,000
// operations (mostly SUCCEEDED, 1% FAILED, a few live and waiting for a
// person, as a long load run leaves them). The seed takes a minute or two.
//
//	go test -run '^$' -bench ListDefaultView1M -benchtime 20x ./internal/operations/
func BenchmarkListDefaultView1M(b *testing.B) {
	if testing.Short() {
		b.Skip("seeds 1,000,000 operations")
	}
	db := testdb.New(b)
	ctx := context.Background()
	seed(b, db, 1_000_000, `CASE WHEN p.id % 100 = 7 THEN 'FAILED'
	                             WHEN p.id % 1000 = 3 THEN 'IN_PROGRESS'
	                             WHEN p.id % 2000 = 5 THEN 'NEEDS_RECONCILIATION'
	                             ELSE 'SUCCEEDED' END`)
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE operations, operation_steps`); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		rows, err := operations.List(ctx, db.Pool, operations.Filter{Limit: 51})
		if err != nil || len(rows) != 51 {
			b.Fatalf("list: %d rows, %v", len(rows), err)
		}
		if _, err := operations.Counts(ctx, db.Pool, operations.Filter{}); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	// The median and the worst: on a shared machine the mean is the noise's.
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "worst-ms")
}
