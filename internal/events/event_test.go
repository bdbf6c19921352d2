package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/testdb"
)

func cancelledEvent(policyID int64) events.Event {
	return events.NewPolicyCancelled(events.PolicyCancelled{
		PolicyID: policyID, PolicyNumber: "P-1", UserID: 1, OperationID: 7,
		RefundKey: "7:refund", RefundAmount: "120.00",
	})
}

func TestWriteCommitsWithTheTransaction(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()

	var committed uuid.UUID
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var err error
		committed, err = outbox.Write(ctx, tx, cancelledEvent(1))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rolledBack := errors.New("roll back")
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := outbox.Write(ctx, tx, cancelledEvent(2)); err != nil {
			return err
		}
		return rolledBack
	})
	if !errors.Is(err, rolledBack) {
		t.Fatal(err)
	}

	var id uuid.UUID
	var typ, key, status, transport string
	var payload json.RawMessage
	err = db.Pool.QueryRow(ctx, `SELECT id, type, key, status, transport, payload FROM outbox`).
		Scan(&id, &typ, &key, &status, &transport, &payload)
	if err != nil {
		t.Fatalf("want exactly the committed event: %v", err)
	}
	if id != committed || typ != events.TypePolicyCancelled || key != "policy:1" || status != "PENDING" || transport != "nats" {
		t.Errorf("row = %s %s %s %s %s, want %s policy.cancelled policy:1 PENDING nats", id, typ, key, status, transport, committed)
	}
	var p events.PolicyCancelled
	if err := json.Unmarshal(payload, &p); err != nil || p.RefundKey != "7:refund" || p.RefundAmount != "120.00" {
		t.Errorf("payload = %s (%v)", payload, err)
	}
}

func TestWriteWithRiverInsertsOneJobPerConsumer(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if err := events.SetTransport(ctx, db.Pool, events.TransportRiver); err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		id, err = outbox.Write(ctx, tx, cancelledEvent(1))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM outbox WHERE id = $1`, id).Scan(&status); err != nil || status != "SENT" {
		t.Errorf("outbox status = %q (%v), want SENT: the job committed with it", status, err)
	}
	rows, err := db.Pool.Query(ctx, `SELECT queue FROM river_job WHERE args->>'id' = $1 ORDER BY queue`, id.String())
	if err != nil {
		t.Fatal(err)
	}
	queues, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(queues) != 3 || queues[0] != "events_history" || queues[1] != "events_ledger" || queues[2] != "events_notifications" {
		t.Errorf("river jobs in queues %v, want one in each of events_history, events_ledger and events_notifications", queues)
	}
}

func TestWriteRefusesBadEventsAndRepeatedIDs(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	write := func(e events.Event) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Write(ctx, tx, e)
			return err
		})
	}
	for _, e := range []events.Event{
		{Type: "Cancelled", Key: "policy:1", Payload: 1},
		{Type: "policy.cancelled", Key: "42", Payload: 1},
		{Type: "policy.cancelled", Key: "policy:1", Payload: make(chan int)},
	} {
		if err := write(e); !errors.Is(err, events.ErrInvalidEvent) {
			t.Errorf("Write(%q, %q) = %v, want ErrInvalidEvent", e.Type, e.Key, err)
		}
	}
	e := cancelledEvent(1)
	e.ID = uuid.New()
	if err := write(e); err != nil {
		t.Fatal(err)
	}
	if err := write(e); err == nil {
		t.Error("the same event id written twice was accepted")
	}
}

// The process dies inside the business transaction, after the outbox
// insert and before the commit: the change and its event are lost
// together. The crash switch is the test's own writer's.
func TestCrashAfterOutboxInsertLosesChangeAndEventTogether(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	outbox := events.NewWriter(abandonAt(t, events.CrashAfterOutboxInsert))
	died := crashed(func() {
		pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO users (name, api_token_sha256) VALUES ('the-change', sha256('x'))`); err != nil {
				return err
			}
			_, err := outbox.Write(ctx, tx, cancelledEvent(1))
			return err
		})
	})
	if !died {
		t.Fatal("Write did not reach its crash point")
	}
	var changes, rows int
	db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM users WHERE name = 'the-change'), (SELECT count(*) FROM outbox)`).Scan(&changes, &rows)
	if changes != 0 || rows != 0 {
		t.Errorf("after the crash: %d changes, %d outbox rows; want neither", changes, rows)
	}
}
