package policies_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/workflow"
)

// The cancellation's round trips to PostgreSQL, counted by a tracer on the
// pool, transaction by transaction, with the web layer's hooks (the key's
// claim in the first transaction, the stored answer in the last). The
// commits are the design (cmd/web's commit count); the round trips inside
// them are the cost — each one holds a pooled connection and the rows the
// transaction locked — so a change that adds one must say why, here.
//
// What each transaction sends:
//
//	tx 1:  BEGIN · the claim (one batch) · record_intent · the steps ·
//	       provider_cancel SENT with its call · the timeline · COMMIT
//	tx 2:  BEGIN · provider_cancel DONE with its answer · mark_cancelled
//	       and publish_event DONE (one statement) · the policy CANCELLED ·
//	       the refund owed · the outbox · the refund owed · refund SENT
//	       with its call · the timeline · COMMIT
//	tx 3:  BEGIN · refund DONE with its answer · audit (DONE, the entry) ·
//	       SUCCEEDED · the stored answer · the timeline · COMMIT
//
// publish_event and the refund's request each read the refund owed (one
// indexed row): data passes between steps through the database, never
// through a memo of the transaction, at two round trips.
func TestACancellationsRoundTrips(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := demo.Reset(ctx, db.Pool, demo.DefaultAccounts(), demo.Dataset{Users: 1, PoliciesPerUser: 3, Slots: 1},
		time.Now(), demo.TokenFor([]byte("rt"))); err != nil {
		t.Fatal(err)
	}
	var rt testdb.RoundTrips
	pool := db.TracedPool(t, &rt)
	store := idempotency.NewStore(pool, 30*time.Second, time.Hour)
	c := policies.NewCanceller(workflow.NewEngine(pool, workflow.Config{}), confirmAtOnce{}, refundAtOnce{}, events.NewWriter(nil))
	rows, err := db.Pool.Query(ctx, `SELECT id, user_id FROM policies ORDER BY id LIMIT 2`)
	if err != nil {
		t.Fatal(err)
	}
	type pol struct{ ID, UserID int64 }
	two, err := pgx.CollectRows(rows, pgx.RowToStructByPos[pol])
	if err != nil || len(two) != 2 {
		t.Fatalf("policies: %v %v", two, err)
	}
	cancel := func(p pol) {
		t.Helper()
		key := fmt.Sprint("rt-", p.ID)
		var claim *idempotency.Claim
		op, err := c.Cancel(ctx, policies.CancelRequest{UserID: p.UserID, PolicyID: p.ID, RequestKey: key, Actor: "test"},
			workflow.Hooks[workflow.Operation]{
				Begin: func(ctx context.Context, tx pgx.Tx) (err error) {
					claim, err = store.Claim(ctx, tx, p.UserID, key, idempotency.Fingerprint(idempotency.Request{Method: "POST", Route: key}))
					return err
				},
				Finish: func(ctx context.Context, tx pgx.Tx, op workflow.Operation, _ error) error {
					resp, err := idempotency.JSONResponse(200, op)
					if err != nil {
						return err
					}
					return claim.Complete(ctx, tx, resp)
				},
			})
		if err != nil || op.Status != workflow.StatusSucceeded {
			t.Fatalf("cancel %d: %+v %v", p.ID, op, err)
		}
	}
	cancel(two[0]) // warm up: each connection prepares a statement the first time
	rt.Take()
	cancel(two[1])
	sent := rt.Take()

	var perTx []int
	n := 0
	for _, sql := range sent {
		n++
		if sql == "commit" {
			perTx = append(perTx, n)
			n = 0
		}
	}
	if want := []int{7, 10, 8}; fmt.Sprint(perTx) != fmt.Sprint(want) || n != 0 {
		t.Errorf("round trips per transaction %v (and %d after the last commit), want %v:\n%s",
			perTx, n, want, strings.Join(sent, "\n"))
	}
}
