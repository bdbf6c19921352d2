package events

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// River is the transport that lives inside PostgreSQL: Write inserts one
// job per consumer with InsertTx in the writer's own transaction, so the
// job exists exactly when the change does and no relay is needed — the
// outbox is the queue. River's retries, job timeout and stuck-job rescuer
// deliver each job at least once; the consumer's inbox makes it once.

// deliveryJob is one event on its way to one consumer. The consumer is the
// job's queue (riverQueue), so each consumer's jobs are worked, retried and
// counted on their own.
type deliveryJob struct {
	Message
}

// Kind names the job for River.
func (deliveryJob) Kind() string { return "idemlab_event" }

// riverQueue is the River queue of a consumer's deliveries.
func riverQueue(consumer string) string { return "events_" + consumer }

// riverMaxAttempts is how many times River runs a delivery before it
// discards it (River's dead letter). Far more than any injector mode needs.
const riverMaxAttempts = 25

// inserter is an insert-only River client: no pool (InsertTx runs on the
// caller's transaction) and no workers, so one serves every database.
var inserter = sync.OnceValues(func() (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(nil), &river.Config{})
})

// insertJobs inserts m's deliveries, one per consumer, in tx.
func insertJobs(ctx context.Context, tx pgx.Tx, m Message) error {
	client, err := inserter()
	if err != nil {
		return fmt.Errorf("events: river client: %w", err)
	}
	params := make([]river.InsertManyParams, 0, len(Consumers))
	for _, c := range Consumers {
		params = append(params, river.InsertManyParams{
			Args:       deliveryJob{Message: m},
			InsertOpts: &river.InsertOpts{Queue: riverQueue(c), MaxAttempts: riverMaxAttempts},
		})
	}
	if _, err := client.InsertManyTx(ctx, tx, params); err != nil {
		return fmt.Errorf("events: insert river jobs for %s: %w", m.ID, err)
	}
	return nil
}
