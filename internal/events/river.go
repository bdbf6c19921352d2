package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// newRiverInserter makes the Writer's insert-only River client.
func newRiverInserter() (*river.Client[pgx.Tx], error) {
	return river.NewClient(riverpgxv5.New(nil), &river.Config{})
}

// insertJobs inserts m's deliveries, one per consumer, in tx.
func (w *Writer) insertJobs(ctx context.Context, tx pgx.Tx, m Message) error {
	client, err := w.river()
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

// RiverConfig configures one instance of the River consumers. Zero fields
// take the defaults.
type RiverConfig struct {
	// ID names this instance's River client (River's own bookkeeping).
	ID string
	// Workers is how many deliveries of one consumer this instance works
	// at once. Default 16.
	Workers int
	// JobTimeout is how long a delivery may run before River cancels its
	// context and counts it failed. Default 30s.
	JobTimeout time.Duration
	// RescueAfter is how long a delivery may stay running before River's
	// rescuer hands it out again — River's ack deadline. It must exceed
	// JobTimeout. Default JobTimeout + 30s.
	RescueAfter time.Duration
	// RetryAfter is the wait before a failed delivery runs again. Default 1s.
	RetryAfter time.Duration
	// PollInterval is how often River looks for jobs when no insert
	// notification woke it. Default 1s.
	PollInterval time.Duration
	// FetchCooldown is the least time between two fetches of one queue:
	// with Workers it bounds throughput (Workers per cooldown). Default
	// 20ms (River's own default is 100ms: 40 jobs/s with 4 workers).
	FetchCooldown time.Duration
	// PollOnly keeps River off LISTEN: it looks for jobs every
	// PollInterval and elects its leader by polling. Set it when the pool
	// goes through a pooler in transaction mode (PgBouncer): there a LISTEN
	// lands on a server connection the pooler lends to the next client, and
	// River would wait for notifications that never reach it
	// (docs/scaling.md).
	PollOnly bool
	Injector *Injector
	Logger   *slog.Logger
}

func (c RiverConfig) withDefaults() RiverConfig {
	c.Workers = cmp.Or(c.Workers, 16)
	c.JobTimeout = cmp.Or(c.JobTimeout, 30*time.Second)
	c.RescueAfter = cmp.Or(c.RescueAfter, c.JobTimeout+30*time.Second)
	c.RetryAfter = cmp.Or(c.RetryAfter, time.Second)
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.FetchCooldown = cmp.Or(c.FetchCooldown, 20*time.Millisecond)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RiverConsumers is one instance of every consumer on River: a River
// client working each consumer's queue. Several instances (processes, or
// clients in a test) share the queues; River's row locks give each job to
// one of them at a time.
type RiverConsumers struct {
	client *river.Client[pgx.Tx]
}

// NewRiverConsumers returns an instance working the queues of handlers.
// Start it with Start; Stop waits for deliveries in flight.
func NewRiverConsumers(pool *pgxpool.Pool, handlers []*Handler, cfg RiverConfig) (*RiverConsumers, error) {
	cfg = cfg.withDefaults()
	if cfg.RescueAfter <= cfg.JobTimeout {
		return nil, errors.New("events: river: RescueAfter must exceed JobTimeout")
	}
	w := &deliveryWorker{handlers: map[string]*Handler{}, inj: cfg.Injector, side: transportSide{
		modes:       Modes, // no relay: every mode happens at delivery
		ackDeadline: cfg.RescueAfter,
		retryAfter:  cfg.RetryAfter,
	}}
	queues := map[string]river.QueueConfig{}
	for _, h := range handlers {
		w.handlers[riverQueue(h.Consumer())] = h
		queues[riverQueue(h.Consumer())] = river.QueueConfig{MaxWorkers: cfg.Workers}
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:                   cfg.ID,
		Queues:               queues,
		Workers:              workers,
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter,
		FetchPollInterval:    cfg.PollInterval,
		FetchCooldown:        cfg.FetchCooldown,
		PollOnly:             cfg.PollOnly,
		MaxAttempts:          riverMaxAttempts,
		Logger:               cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("events: river client: %w", err)
	}
	return &RiverConsumers{client: client}, nil
}

// Start begins working jobs; it returns at once.
func (r *RiverConsumers) Start(ctx context.Context) error { return r.client.Start(ctx) }

// Stop stops fetching and waits for the deliveries in flight.
func (r *RiverConsumers) Stop(ctx context.Context) error { return r.client.Stop(ctx) }

// deliveryWorker runs each job through the consumer rule. Its return value
// is the acknowledgement: nil completes the job; an error or a snooze has
// River run it again.
type deliveryWorker struct {
	river.WorkerDefaults[deliveryJob]
	handlers map[string]*Handler // by queue
	inj      *Injector
	side     transportSide
}

func (w *deliveryWorker) Work(ctx context.Context, job *river.Job[deliveryJob]) error {
	h, ok := w.handlers[job.Queue]
	if !ok {
		return river.JobCancel(fmt.Errorf("no consumer works queue %q", job.Queue))
	}
	v := process(ctx, h, w.inj, w.side, Delivery{Message: job.Args.Message, Attempt: job.Attempt})
	switch {
	case v.ack:
		return nil
	case v.silent:
		// The acknowledgement never arrives: River's job timeout ends the
		// wait and counts the attempt failed.
		<-ctx.Done()
		return ctx.Err()
	case v.failed:
		return errors.New("the handler reported failure")
	default:
		return river.JobSnooze(v.delay)
	}
}

// NextRetry sets the wait before a failed delivery runs again.
func (w *deliveryWorker) NextRetry(*river.Job[deliveryJob]) time.Time {
	return time.Now().Add(w.side.retryAfter)
}
