package events

import "errors"

// The consumers. Each has its own inbox rows, its own durable consumer on
// NATS, its own River queue, its own Kafka consumer group and its own task
// queue, so one consumer's failures never hold up the other's deliveries.
const (
	// ConsumerNotifications writes the customer's message into the mailbox.
	ConsumerNotifications = "notifications"
	// ConsumerLedger keeps the per-day projection of cancellations,
	// refunds and bookings.
	ConsumerLedger = "ledger"
	// ConsumerHistory keeps each aggregate's history, applied in the
	// order its events happened (Message.Seq), whatever order they come in.
	ConsumerHistory = "history"
)

// Consumers lists every consumer an event is delivered to.
var Consumers = []string{ConsumerNotifications, ConsumerLedger, ConsumerHistory}

// ErrUnknownConsumer names a consumer that does not exist.
var ErrUnknownConsumer = errors.New("events: unknown consumer")
