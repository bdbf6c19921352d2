package fault_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkArrive measures what the deadline costs a call's arrival: the
// same transaction with and without the conditional INSERT that refuses a
// late call (run side by side in one process: compare the two lines, not
// either with another run).
func BenchmarkArrive(b *testing.B) {
	db := testdb.New(b)
	store := fault.NewStore(db.Pool, "bench", "policy")
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		deadline func() time.Time
	}{
		{"no-deadline", func() time.Time { return time.Time{} }},
		{"on-time", func() time.Time { return time.Now().Add(time.Minute) }},
		{"late", func() time.Time { return time.Now().Add(-time.Second) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				_, err := store.Arrive(ctx, fault.Arrival{Key: fmt.Sprint("k", i), Subject: fault.Policy(1), Deadline: tc.deadline()})
				if err != nil && tc.name != "late" {
					b.Fatal(err)
				}
			}
		})
	}
}
