package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/tracing"
)

// Event types. A type names what happened, past tense, to which aggregate.
const (
	TypePolicyCancelled  = "policy.cancelled"
	TypeBookingConfirmed = "booking.confirmed"
	TypeBookingReleased  = "booking.released"
	// The deposit saga's hold (internal/slots/deposit.go): a slot held for
	// a booking while its deposit is charged, and the hold released when
	// the deposit was refused. Consumers that do not know them ignore them.
	TypeBookingHeld         = "booking.held"
	TypeBookingHoldReleased = "booking.hold_released"
)

// Transports an event can travel on (EVENTS_TRANSPORT).
const (
	TransportNATS  = "nats"  // the relay publishes to NATS JetStream
	TransportRiver = "river" // the writer's transaction inserts River jobs
	TransportKafka = "kafka" // the relay produces to a Kafka topic
	TransportTasks = "tasks" // the relay creates Cloud Tasks, the queue pushes them to the app
)

// Transports lists the transports this build implements.
var Transports = []string{TransportNATS, TransportRiver, TransportKafka, TransportTasks}

var (
	// ErrInvalidEvent: a type, key or payload the outbox would refuse.
	ErrInvalidEvent = errors.New("events: invalid event")
	// ErrUnknownTransport names a transport that does not exist.
	ErrUnknownTransport = errors.New("events: unknown transport")
)

// Event is one fact a producer publishes, written with Write.
type Event struct {
	// ID is the event's identity, assigned by the producer: every consumer
	// dedupes on it. Zero means Write assigns a new one (a UUIDv7, so ids
	// written together sit together in the primary key).
	ID uuid.UUID
	// Type is what happened (TypePolicyCancelled, …).
	Type string
	// Key is the aggregate it happened to: "policy:42", "booking:7".
	Key string
	// Payload is marshalled to JSON: PolicyCancelled, BookingChanged, or any
	// JSON-marshallable value for a type a consumer understands.
	Payload any
}

// Message is an event as a consumer receives it.
type Message struct {
	ID        uuid.UUID       `json:"id"`
	Type      string          `json:"type"`
	Key       string          `json:"key"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
	// Seq is the event's place in its aggregate's history (Key): 1 for
	// the aggregate's first event, 2 for its second, assigned in the
	// writer's transaction (Write). 0: written before events had one.
	Seq int64 `json:"seq,omitempty"`
	// Traceparent is the W3C trace context of the transaction that wrote
	// the event (its request's, or recovery's): each consumer's span
	// continues that trace. Every transport carries it in the message and,
	// where it has headers, in a traceparent header too.
	Traceparent string `json:"traceparent,omitempty"`
}

// HeaderTraceparent carries the event's trace (W3C Trace Context) on every
// transport with headers: a NATS or Kafka header, a task's HTTP header.
const HeaderTraceparent = "traceparent"

// PolicyCancelled is the payload of policy.cancelled, written in the
// transaction that marks the policy CANCELLED.
type PolicyCancelled struct {
	PolicyID     int64  `json:"policy_id"`
	PolicyNumber string `json:"policy_number"`
	UserID       int64  `json:"user_id"`
	OperationID  int64  `json:"operation_id"`
	// RefundKey is the refund step's key ("{operation id}:refund"): the
	// identity of the one refund this cancellation owes.
	RefundKey string `json:"refund_key"`
	// RefundAmount is the exact decimal owed back, e.g. "120.00".
	RefundAmount string    `json:"refund_amount"`
	CancelledAt  time.Time `json:"cancelled_at"`
}

// BookingChanged is the payload of booking.confirmed and booking.released.
type BookingChanged struct {
	BookingID int64     `json:"booking_id"`
	SlotID    int64     `json:"slot_id"`
	UserID    int64     `json:"user_id"`
	Resource  string    `json:"resource"`
	StartsAt  time.Time `json:"starts_at"`
	// At is when the booking was confirmed or released.
	At time.Time `json:"at"`
}

// NewPolicyCancelled returns the policy.cancelled event for p.
func NewPolicyCancelled(p PolicyCancelled) Event {
	return Event{Type: TypePolicyCancelled, Key: fmt.Sprintf("policy:%d", p.PolicyID), Payload: p}
}

// NewBookingConfirmed returns the booking.confirmed event for b.
func NewBookingConfirmed(b BookingChanged) Event {
	return Event{Type: TypeBookingConfirmed, Key: fmt.Sprintf("booking:%d", b.BookingID), Payload: b}
}

// NewBookingHeld returns the booking.held event for b.
func NewBookingHeld(b BookingChanged) Event {
	return Event{Type: TypeBookingHeld, Key: fmt.Sprintf("booking:%d", b.BookingID), Payload: b}
}

// NewBookingHoldReleased returns the booking.hold_released event for b.
func NewBookingHoldReleased(b BookingChanged) Event {
	return Event{Type: TypeBookingHoldReleased, Key: fmt.Sprintf("booking:%d", b.BookingID), Payload: b}
}

// NewBookingReleased returns the booking.released event for b.
func NewBookingReleased(b BookingChanged) Event {
	return Event{Type: TypeBookingReleased, Key: fmt.Sprintf("booking:%d", b.BookingID), Payload: b}
}

// The crash points of the events package, in the order an event passes them.
const (
	// CrashAfterOutboxInsert: the outbox row is written inside the
	// business transaction, which has not committed: a crash here loses the
	// change and its event together.
	CrashAfterOutboxInsert crash.Point = "after_outbox_insert"
	// CrashRelayAfterPublishBeforeMark: the broker acknowledged the publish;
	// the row is still PENDING. The next relay publishes it again — the
	// contract — and the broker's dedupe window or the inbox absorbs it.
	CrashRelayAfterPublishBeforeMark crash.Point = "relay_after_publish_before_mark"
	// CrashConsumerAfterCommitBeforeAck: the consumer's effect and inbox row
	// are committed; the transport was never told. It delivers again and
	// the inbox answers "applied already".
	CrashConsumerAfterCommitBeforeAck crash.Point = "consumer_after_commit_before_ack"
)

// CrashPoints lists them for the crash switch.
var CrashPoints = []crash.Point{CrashAfterOutboxInsert, CrashRelayAfterPublishBeforeMark, CrashConsumerAfterCommitBeforeAck}

var (
	typePattern = regexp.MustCompile(`^[a-z]+(\.[a-z_]+)+$`)
	keyPattern  = regexp.MustCompile(`^[a-z_]+:.+$`)
)

const sqlWrite = `
WITH place AS (
    -- the aggregate's next place: the row lock is held to the writer's
    -- commit, so one aggregate's writers take turns and a rollback hands the
    -- place back (migration 00143 says why not max(seq) + 1 or a sequence)
    INSERT INTO outbox_sequences AS s (key, last_seq)
    VALUES ($3, 1)
        ON CONFLICT (key) DO UPDATE
       SET last_seq = s.last_seq + 1
    RETURNING last_seq
), written AS (
    INSERT INTO outbox (id, type, key, payload, transport, status, sent_at, seq, traceparent)
    SELECT $1, $2, $3, $4, c.transport,
           -- River's job commits with this row: nothing is left to relay
           CASE WHEN c.transport = 'river' THEN 'SENT' ELSE 'PENDING' END,
           CASE WHEN c.transport = 'river' THEN clock_timestamp() END,
           place.last_seq, nullif($6, '')
      FROM events_config c, place
    RETURNING transport, created_at, seq
)
SELECT transport, created_at, seq,
       -- wakes the listening relays when the writer commits, if $5 says it
       -- is this writer's turn (see wakeRelays); polling is the guarantee
       CASE WHEN $5 AND transport <> 'river' THEN pg_notify('idemlab_outbox', transport) END
  FROM written`

// wakeEvery is how often, at most, the writers of one process wake the
// relays of one database with a NOTIFY. A transaction that notified takes
// PostgreSQL's notify lock at commit — one lock for the whole server —
// and holds it until its commit record is flushed, so one NOTIFY per event
// made every event's commit wait its turn behind every other's fsync (the
// top wait, Lock:object, while recovery drained 10,000 cancellations). A
// relay woken stays awake for RelayConfig.AwakeFor (1 s, well over
// wakeEvery), polling every AwakeInterval, so the events written by the
// writers not notifying meanwhile are relayed as promptly.
const wakeEvery = 100 * time.Millisecond

// Writer writes events into the outbox, in the caller's transaction. One
// serves the whole process (run() makes it and hands it to every workflow):
// it holds what the writers share — when one of them last woke the relays
// of each database, the River client that inserts jobs, and the crash
// switch Write passes CrashAfterOutboxInsert to.
type Writer struct {
	crash *crash.Switch
	// wakes is, per database, when a writer last notified (UnixNano in an
	// *atomic.Int64).
	wakes sync.Map
	// river is an insert-only River client, made at the first River event:
	// no pool (InsertTx runs on the caller's transaction) and no workers,
	// so one serves every database.
	river func() (*river.Client[pgx.Tx], error)
}

// NewWriter returns a writer that passes CrashAfterOutboxInsert to crashes
// (nil: never crashes).
func NewWriter(crashes *crash.Switch) *Writer {
	return &Writer{crash: crashes, river: sync.OnceValues(newRiverInserter)}
}

// wakeRelays is whether a writer on conn's database notifies now: the
// first writer of each wakeEvery per database does.
func (w *Writer) wakeRelays(conn *pgx.Conn) bool {
	cfg := conn.Config()
	v, _ := w.wakes.LoadOrStore(fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), new(atomic.Int64))
	last := v.(*atomic.Int64)
	now, seen := time.Now().UnixNano(), last.Load()
	return now-seen >= int64(wakeEvery) && last.CompareAndSwap(seen, now)
}

// Write records e in the outbox inside tx — the caller's business
// transaction — and returns its id. The event exists exactly when the
// change it describes commits. With the River transport it also inserts
// one River job per consumer in tx (the outbox is then the queue itself).
// The event takes the next place in its aggregate's history (Message.Seq):
// the writer's transaction holds the aggregate's counter row until it
// commits, so a second writer of the same aggregate waits for it.
// Errors: ErrInvalidEvent; a duplicate id is a unique violation (the
// producer wrote this event already), returned wrapped.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, e Event) (uuid.UUID, error) {
	if e.ID == uuid.Nil {
		e.ID = uuid.Must(uuid.NewV7())
	}
	if !typePattern.MatchString(e.Type) {
		return uuid.Nil, fmt.Errorf("%w: type %q is not like policy.cancelled", ErrInvalidEvent, e.Type)
	}
	if !keyPattern.MatchString(e.Key) {
		return uuid.Nil, fmt.Errorf("%w: key %q is not like policy:42", ErrInvalidEvent, e.Key)
	}
	payload, err := json.Marshal(e.Payload)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%w: payload: %v", ErrInvalidEvent, err)
	}
	var transport string
	m := Message{ID: e.ID, Type: e.Type, Key: e.Key, Payload: payload, Traceparent: tracing.Parent(ctx)}
	if err := tx.QueryRow(ctx, sqlWrite, e.ID, e.Type, e.Key, payload, w.wakeRelays(tx.Conn()), m.Traceparent).Scan(&transport, &m.CreatedAt, &m.Seq, nil); err != nil {
		return uuid.Nil, fmt.Errorf("events: write %s %s: %w", e.Type, e.Key, err)
	}
	if transport == TransportRiver {
		if err := w.insertJobs(ctx, tx, m); err != nil {
			return uuid.Nil, err
		}
	}
	w.crash.At(ctx, CrashAfterOutboxInsert)
	return e.ID, nil
}

// ParseTransport returns the transport named s ("" is NATS).
func ParseTransport(s string) (string, error) {
	if s == "" {
		return TransportNATS, nil
	}
	if !slices.Contains(Transports, s) {
		return "", fmt.Errorf("%w %q (want %s)", ErrUnknownTransport, s, strings.Join(Transports, ", "))
	}
	return s, nil
}

// SetTransport records which transport this database's events travel on
// from now on; rows already written keep theirs. The app calls it at start.
func SetTransport(ctx context.Context, db database.DBTX, transport string) error {
	if _, err := ParseTransport(transport); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `
		UPDATE events_config
		   SET transport = $1,
		       updated_at = now()
		 WHERE transport <> $1 -- unchanged: no write`, transport)
	if err != nil {
		return fmt.Errorf("events: set transport: %w", err)
	}
	return nil
}
