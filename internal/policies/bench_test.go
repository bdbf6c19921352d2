package policies_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/workflow"
)

// BenchmarkCancelTransactions measures the cancellation's own transactions
// without the HTTP round trips between them: record the intent and
// provider_cancel SENT; the provider's outcome with mark_cancelled,
// publish_event and refund SENT; the refund's outcome with audit. Both
// systems are in-process clients that confirm at once. Each iteration
// cancels a fresh policy. It reports the round trips to PostgreSQL per
// cancellation as well (TestACancellationsRoundTrips says which).
//
//	go test -run '^$' -bench CancelTransactions ./internal/policies/
func BenchmarkCancelTransactions(b *testing.B) {
	db := testdb.New(b)
	ctx := context.Background()
	_, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{Users: 100, PoliciesPerUser: 100, Slots: 1}, time.Now(), demo.TokenFor([]byte("b")))
	if err != nil {
		b.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id, user_id FROM policies ORDER BY id`)
	if err != nil {
		b.Fatal(err)
	}
	type pol struct{ ID, UserID int64 }
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pol])
	if err != nil {
		b.Fatal(err)
	}
	var rt testdb.RoundTrips
	c := policies.NewCanceller(workflow.NewEngine(db.TracedPool(b, &rt), workflow.Config{}), confirmAtOnce{}, refundAtOnce{}, events.NewWriter(nil))
	i := 0
	for b.Loop() {
		if i == len(list) {
			b.Fatalf("ran out of policies after %d iterations", i)
		}
		p := list[i]
		i++
		op, err := c.Cancel(ctx, policies.CancelRequest{UserID: p.UserID, PolicyID: p.ID, RequestKey: fmt.Sprint("k", i), Actor: "bench"},
			workflow.Hooks[workflow.Operation]{})
		if err != nil || op.Status != workflow.StatusSucceeded {
			b.Fatalf("cancel: %+v %v", op, err)
		}
	}
	b.ReportMetric(float64(len(rt.Take()))/float64(i), "roundtrips/op")
}

// confirmAtOnce and refundAtOnce are a provider and a payments service
// that confirm every call without a network: the benchmark's second
// provider.Client and payments.Client.
type confirmAtOnce struct{}

func (confirmAtOnce) Deadline() time.Time { return time.Now().Add(time.Second) }

func (confirmAtOnce) Cancel(context.Context, provider.CancelRequest) (provider.Result, error) {
	return provider.Result{Outcome: provider.Confirmed, Truth: provider.TruthCompleted}, nil
}

func (confirmAtOnce) Status(context.Context, string) (provider.Truth, error) {
	return provider.TruthCompleted, nil
}

type refundAtOnce struct{}

func (refundAtOnce) Deadline() time.Time { return time.Now().Add(time.Second) }

func (refundAtOnce) Charge(context.Context, payments.ChargeRequest) (external.Result, error) {
	return external.Result{Outcome: external.Confirmed, Truth: external.TruthCompleted}, nil
}

func (refundAtOnce) Refund(context.Context, payments.RefundRequest) (external.Result, error) {
	return external.Result{Outcome: external.Confirmed, Truth: external.TruthCompleted}, nil
}

func (refundAtOnce) ChargeStatus(context.Context, string) (external.Truth, error) {
	return external.TruthCompleted, nil
}

func (refundAtOnce) RefundStatus(context.Context, string) (external.Truth, error) {
	return external.TruthCompleted, nil
}
