// Package events carries facts out of a business transaction to the
// consumers that act on them, at least once, and makes each consumer's
// effect happen exactly once per event.
//
// # Producing: the outbox
//
// A workflow calls Write inside its own transaction. The event becomes a
// row of the outbox table in that transaction, so the change and the news
// of it commit together or not at all — there is no moment where one is
// durable and the other is not (the dual write this package exists to
// avoid). The producer assigns the event id, a UUID; it is the identity
// every later layer dedupes on.
//
//	outbox row:  PENDING ──relay publishes, broker acks──▶ SENT ──retention──▶ deleted
//	                │  ▲
//	   publish fails│  │ a person replays it (keyed)
//	   max times    ▼  │
//	               DEAD
//
// # Transports
//
//   - NATS JetStream, a broker outside PostgreSQL: the relay claims due
//     PENDING rows (FOR UPDATE SKIP LOCKED inside a claim that leases them),
//     publishes each with Nats-Msg-Id = event id, waits for the broker's
//     ack, then marks the row SENT, fenced by its claim token. A crash
//     between the ack and the mark publishes again — that is the contract;
//     the broker drops a repeat inside its dedupe window, the inbox after.
//   - River, a queue inside PostgreSQL: Write also inserts one River job per
//     consumer, with InsertTx, in the same transaction. The row is SENT at
//     once; River's retries, job timeout and rescuer deliver the job.
//   - Kafka, a partitioned log: the relay produces each row with its event
//     id as the record key (the idempotent producer dedupes only one
//     session's retries); each consumer is a consumer group whose members
//     commit offsets only after the effect's transaction committed, so a
//     crash, a lost commit or a rebalance in between redelivers from the
//     committed offset. The broker is a real cluster (KAFKA_BROKERS) or
//     kfake in the process (KafkaBroker).
//   - Cloud Tasks, a queue that pushes: the relay creates one task per
//     event and consumer, named by the event id (the queue refuses a second
//     create of a name while the task is pending and for its window after
//     it ran); the queue pushes each to the app's push handler (TasksPush)
//     until a push is answered 2xx, and pushes again after a failure or a
//     push past its dispatch deadline — after the handler's commit too.
//
// # Consuming: the inbox
//
// Every delivery, on every transport, goes through one rule (Handler):
//
//	BEGIN
//	  INSERT INTO inbox (consumer, event_id) … ON CONFLICT DO NOTHING
//	  1 row  → apply the effect (mailbox message, ledger line)
//	  0 rows → applied already: do nothing
//	COMMIT
//	then acknowledge to the transport
//
// A crash before COMMIT rolls back effect and inbox row together: the
// redelivery applies it. A crash after COMMIT and before the ack: the
// redelivery finds the inbox row and applies nothing. Never "mark seen,
// then handle" (a crash in between loses the effect), and never dedupe on
// the transport's offset or delivery id (a republished event gets a new
// one) or a hash of the payload (two real events can look alike).
//
// Invariant (DESIGN.md 9): after heal, every committed event is delivered
// at least once and applied exactly once by each consumer; no inbox row
// without its effect.
package events
