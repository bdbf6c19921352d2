package fake_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkRefund is one refund through the real client, HTTP and the fake's
// transactions (Arrive, then the record and the ledger row): new keys, and
// repeats of one key on the idempotent service (no ledger row).
func BenchmarkRefund(b *testing.B) {
	s := serve(b, testdb.New(b))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		key  func(i int) string
	}{
		{"new-key", func(i int) string { return fmt.Sprint("new-", i) }},
		{"repeat", func(int) string { return "same" }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				res, err := s.client.Refund(ctx, payments.RefundRequest{Key: tc.key(i), PolicyID: 1, AmountCents: 100})
				if err != nil || res.Outcome != external.Confirmed {
					b.Fatalf("refund: %+v, %v", res, err)
				}
			}
		})
	}
}
