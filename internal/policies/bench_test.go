package policies_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/testdb"
)

// BenchmarkStartAndSucceed measures the cancellation's own two
// transactions without the provider call between them: record the intent
// (insert + event), then the fenced finish (operation SUCCEEDED, policy
// CANCELLED, event). Each iteration cancels a fresh policy.
//
//	go test -run '^$' -bench StartAndSucceed ./internal/policies/
func BenchmarkStartAndSucceed(b *testing.B) {
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
	st := policies.NewStore(db.Pool)
	owner := policies.Owner{ID: "bench", Lease: 30 * time.Second}
	i := 0
	for b.Loop() {
		if i == len(list) {
			b.Fatalf("ran out of policies after %d iterations", i)
		}
		p := list[i]
		i++
		var op policies.Operation
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			op, err = st.StartCancellation(ctx, tx, p.UserID, p.ID, fmt.Sprint("k", i), "", owner)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := st.Succeed(ctx, tx, op.ID, *op.OwnerToken, "bench", "confirmed")
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
