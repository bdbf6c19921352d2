package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/tracing"
)

// Delivery outcomes, as event_deliveries records them.
const (
	OutcomeApplied   = "applied"   // new to the inbox: the effect was applied
	OutcomeDuplicate = "duplicate" // the inbox had it: nothing applied
	OutcomeDeferred  = "deferred"  // sent back unhandled (the injector's out_of_order)
	OutcomeFailed    = "failed"    // the effect's transaction failed and rolled back
	OutcomeHeld      = "held"      // held past the ack deadline before handling (the injector's hold_past_deadline)
)

// The layers that can catch a duplicate.
const (
	LayerBroker = "broker" // the broker's dedupe window dropped a repeated publish
	LayerInbox  = "inbox"  // the consumer's inbox found the event applied already
)

// A Consumer applies the effect of one event inside tx. Apply is called
// only for an event this consumer's inbox has not seen, and its writes
// commit with the inbox row or not at all. It must not call other systems:
// everything it does is in tx.
type Consumer interface {
	Name() string
	Apply(ctx context.Context, tx pgx.Tx, m Message) error
}

// Delivery is one arrival of an event at a consumer.
type Delivery struct {
	Message
	// Attempt is the transport's own count (NATS's NumDelivered, River's
	// attempt). Recorded, never used to dedupe.
	Attempt int
	// Injected is the injector mode applied to this delivery, if any.
	Injected Mode
	// Via is where the transport had it from, in its own terms ("partition
	// 2 offset 17", a task's name): shown, never used to dedupe.
	Via string
}

// Handler is the consumer rule, the one place every transport's
// deliveries go through:
//
//	BEGIN
//	  INSERT INTO inbox … ON CONFLICT DO NOTHING   -- claim/check, by event id
//	  new → Apply (the effect)                     -- execute
//	  the delivery's record
//	COMMIT                                         -- effect and "done" together
//	(the transport acknowledges after Handle returns)
type Handler struct {
	pool      *pgxpool.Pool
	consumer  Consumer
	transport string
	instance  string
	crash     *crash.Switch
	metrics   *Metrics
	logger    *slog.Logger
}

// HandlerConfig says where a Handler runs.
type HandlerConfig struct {
	Transport string
	Instance  string // this process, for the deliveries log
	Crash     *crash.Switch
	Metrics   *Metrics
	Logger    *slog.Logger
}

// NewHandler returns the consumer rule for c.
func NewHandler(pool *pgxpool.Pool, c Consumer, cfg HandlerConfig) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler{pool: pool, consumer: c, transport: cfg.Transport, instance: cfg.Instance,
		crash: cfg.Crash, metrics: cfg.Metrics, logger: cfg.Logger}
}

// Consumer names the handler's consumer.
func (h *Handler) Consumer() string { return h.consumer.Name() }

const sqlInboxClaim = `
INSERT INTO inbox (consumer, event_id, event_type)
VALUES ($1, $2, $3)
    ON CONFLICT DO NOTHING -- 0 rows: this consumer applied this event already`

const sqlRecordDelivery = `
INSERT INTO event_deliveries (event_id, consumer, transport, instance, attempt, outcome, caught_by, injected, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// Handle applies d once for this consumer and returns the outcome
// (OutcomeApplied or OutcomeDuplicate). On an error nothing of it is
// committed and the transport must deliver it again. The caller
// acknowledges only after Handle returned without error: a crash in
// between (CrashConsumerAfterCommitBeforeAck) redelivers, and the inbox
// answers "duplicate".
func (h *Handler) Handle(ctx context.Context, d Delivery) (string, error) {
	name := h.consumer.Name()
	// Each delivery is a span in the trace of the transaction that wrote
	// the event (Message.Traceparent).
	ctx, span := tracing.Start(ctx, "consume "+d.Type+" by "+name, d.Traceparent)
	defer span.End()
	outcome := OutcomeDuplicate
	err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlInboxClaim, name, d.ID, d.Type)
		if err != nil {
			return fmt.Errorf("inbox: %w", err)
		}
		var caughtBy *string
		if tag.RowsAffected() == 1 {
			outcome = OutcomeApplied
			if err := h.consumer.Apply(ctx, tx, d.Message); err != nil {
				return fmt.Errorf("apply: %w", err)
			}
		} else {
			caughtBy = new(LayerInbox)
		}
		_, err = tx.Exec(ctx, sqlRecordDelivery, d.ID, name, h.transport, h.instance, d.Attempt,
			outcome, caughtBy, nullMode(d.Injected), d.Via)
		return err
	})
	if err != nil {
		h.recordFailure(ctx, d, err)
		return "", fmt.Errorf("events: %s: handle %s: %w", name, d.ID, err)
	}
	h.metrics.delivered(name, h.transport, outcome)
	h.crash.At(ctx, CrashConsumerAfterCommitBeforeAck)
	return outcome, nil
}

// Defer records that d was sent back unhandled.
func (h *Handler) Defer(ctx context.Context, d Delivery, why string) {
	h.record(ctx, d, OutcomeDeferred, why)
}

// hold records that d is being held past the transport's ack deadline
// before it is handled: a transport that keeps no delivery count (Kafka)
// then knows the copy it hands to another instance is not a first one.
func (h *Handler) hold(ctx context.Context, d Delivery) {
	h.record(ctx, d, OutcomeHeld, "held past the ack deadline")
}

// priorDeliveries counts the deliveries of id recorded for this consumer.
func (h *Handler) priorDeliveries(ctx context.Context, id uuid.UUID) (int, error) {
	var n int
	err := h.pool.QueryRow(ctx, `
		SELECT count(*)
		  FROM event_deliveries
		 WHERE event_id = $1
		   AND consumer = $2`, id, h.consumer.Name()).Scan(&n)
	return n, err
}

// recordFailure writes the failed delivery outside the rolled-back
// transaction, so the Events page shows it.
func (h *Handler) recordFailure(ctx context.Context, d Delivery, cause error) {
	h.record(ctx, d, OutcomeFailed, cause.Error())
}

func (h *Handler) record(ctx context.Context, d Delivery, outcome, detail string) {
	h.metrics.delivered(h.consumer.Name(), h.transport, outcome)
	if d.Via != "" {
		detail += " (" + d.Via + ")"
	}
	_, err := h.pool.Exec(context.WithoutCancel(ctx), sqlRecordDelivery, d.ID, h.consumer.Name(), h.transport,
		h.instance, d.Attempt, outcome, nil, nullMode(d.Injected), detail)
	if err != nil {
		h.logger.Warn("events: could not record a delivery", "event", d.ID, "outcome", outcome, "err", err)
	}
}

func nullMode(m Mode) *string {
	if m == "" {
		return nil
	}
	return new(string(m))
}

// waitApplied waits until this consumer's inbox has id, or for at most
// bound (the injector's hold_past_deadline).
func (h *Handler) waitApplied(ctx context.Context, id uuid.UUID, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		var applied bool
		err := h.pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM inbox WHERE consumer = $1 AND event_id = $2)`,
			h.consumer.Name(), id).Scan(&applied)
		if err != nil || applied {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
