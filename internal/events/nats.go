package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSConfig names the stream and says how long the broker remembers.
// Zero fields take the defaults.
type NATSConfig struct {
	// Stream is the JetStream stream's name. Default IDEMLAB_EVENTS.
	Stream string
	// Subject prefixes every event's subject: <Subject>.<type>, e.g.
	// idemlab.events.policy.cancelled. Default idemlab.events.
	Subject string
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id and
	// drops a repeat publish. Past it, a repeat is a new message and only
	// the inbox catches it. Default 2m (JetStream's own default).
	DuplicateWindow time.Duration
	// AckWait is how long JetStream waits for a consumer's ack before it
	// redelivers. Default 30s.
	AckWait time.Duration
	// MaxAge is how long the stream keeps messages. Default 24h.
	MaxAge time.Duration
	// PublishTimeout bounds the wait for one batch's acks. Default 5s.
	PublishTimeout time.Duration
	// Replicas is how many servers of a JetStream cluster keep the stream
	// and its consumers (EVENTS_REPLICAS). A publish is acknowledged once a
	// majority has it, so with 3 one server may die — its leader included —
	// without losing an acknowledged event. Default 1: a single server.
	Replicas int
}

func (c NATSConfig) withDefaults() NATSConfig {
	c.Stream = cmp.Or(c.Stream, "IDEMLAB_EVENTS")
	c.Subject = cmp.Or(c.Subject, "idemlab.events")
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, 2*time.Minute)
	c.AckWait = cmp.Or(c.AckWait, 30*time.Second)
	c.MaxAge = cmp.Or(c.MaxAge, 24*time.Hour)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	c.Replicas = cmp.Or(c.Replicas, 1)
	return c
}

// NATS is the JetStream transport: the relay's Publisher, and the source
// of each consumer's deliveries (one durable pull consumer per consumer,
// shared by every instance of it).
type NATS struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	cfg    NATSConfig
}

// NewNATS creates (or updates) the stream and one durable consumer per
// consumer on nc. The app calls it at start; it is idempotent.
func NewNATS(ctx context.Context, nc *nats.Conn, cfg NATSConfig) (*NATS, error) {
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("events: jetstream: %w", err)
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   []string{cfg.Subject + ".>"},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy, // every durable consumer reads every message
		MaxAge:     cfg.MaxAge,
		Duplicates: cfg.DuplicateWindow,
		Replicas:   cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("events: stream %s: %w", cfg.Stream, err)
	}
	for _, c := range Consumers {
		_, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:    c,
			AckPolicy:  jetstream.AckExplicitPolicy, // a delivery counts only once the consumer acks it
			AckWait:    cfg.AckWait,
			MaxDeliver: -1, // never give up: the inbox makes repeats harmless
		})
		if err != nil {
			return nil, fmt.Errorf("events: consumer %s: %w", c, err)
		}
	}
	return &NATS{js: js, stream: stream, cfg: cfg}, nil
}

// Transport names it.
func (n *NATS) Transport() string { return TransportNATS }

// DuplicateWindow is the stream's dedupe window.
func (n *NATS) DuplicateWindow() time.Duration { return n.cfg.DuplicateWindow }

// HeaderKey carries the event's aggregate ("policy:42") on a JetStream
// message: what a consumer instance keeps one delivery in flight per.
const HeaderKey = "Idemlab-Key"

// Publish sends every message without waiting in between, then waits for
// each one's ack. The event id is the Nats-Msg-Id: JetStream stores one
// message per id inside its window and answers a repeat "duplicate".
func (n *NATS) Publish(ctx context.Context, ms []Message) []PublishResult {
	results := make([]PublishResult, len(ms))
	futures := make([]jetstream.PubAckFuture, len(ms))
	for i, m := range ms {
		data, err := json.Marshal(m)
		if err != nil {
			results[i].Err = err
			continue
		}
		msg := &nats.Msg{Subject: n.cfg.Subject + "." + m.Type, Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, m.ID.String())
		// The aggregate, for the consumer's lanes (one delivery of an
		// aggregate in flight per instance; see consume).
		msg.Header.Set(HeaderKey, m.Key)
		if m.Traceparent != "" { // for tools that read traces off headers; the consumer reads the message's
			msg.Header.Set(HeaderTraceparent, m.Traceparent)
		}
		if futures[i], err = n.js.PublishMsgAsync(msg); err != nil {
			results[i].Err = err
		}
	}
	timeout := time.NewTimer(n.cfg.PublishTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			results[i].Duplicate = ack.Duplicate
		case err := <-f.Err():
			results[i].Err = err
		case <-timeout.C:
			results[i].Err = errors.New("no publish ack in time")
			timeout.Reset(0) // the rest are late too: collect what has arrived, fail the others
		case <-ctx.Done():
			results[i].Err = ctx.Err()
		}
	}
	return results
}

// ConsumerConfig configures a consumer instance. Zero fields take the
// defaults.
type ConsumerConfig struct {
	// Batch is how many deliveries one fetch asks for. Default 50.
	Batch int
	// Wait is how long one fetch waits for deliveries. Default 1s.
	Wait time.Duration
	// RetryAfter is the wait before a delivery whose transaction failed is
	// redelivered. Default 1s.
	RetryAfter time.Duration
	// Workers is how many deliveries one NATS consumer instance handles at
	// once (Run; runOnce handles its batch in turn). Default 16, as River's
	// per queue. One at a time, a consumer's commits queued one behind the
	// other and fell behind the app's cancellation rate: the lag grew for
	// the whole of a loaded run (p99 7.5 s). Each worker is a lane: the
	// deliveries of one aggregate always take the same lane, so an instance
	// handles them one at a time, in the order JetStream handed them over.
	// Kafka's consumer ignores it: its offsets commit in order.
	Workers  int
	Injector *Injector
	Logger   *slog.Logger
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	c.Batch = cmp.Or(c.Batch, 50)
	c.Wait = cmp.Or(c.Wait, time.Second)
	c.RetryAfter = cmp.Or(c.RetryAfter, time.Second)
	c.Workers = cmp.Or(c.Workers, 16)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// NATSConsumer is one instance of a consumer reading its durable JetStream
// consumer. Several instances of one consumer share its deliveries; a
// delivery not acked within AckWait goes to whichever asks next.
type NATSConsumer struct {
	cons jetstream.Consumer
	h    *Handler
	cfg  ConsumerConfig
	side transportSide
}

// Consumer returns an instance of h's consumer on n.
func (n *NATS) Consumer(ctx context.Context, h *Handler, cfg ConsumerConfig) (*NATSConsumer, error) {
	cons, err := n.stream.Consumer(ctx, h.Consumer())
	if err != nil {
		return nil, fmt.Errorf("events: consumer %s: %w", h.Consumer(), err)
	}
	cfg = cfg.withDefaults()
	return &NATSConsumer{cons: cons, h: h, cfg: cfg, side: transportSide{
		// deliver_twice and after_window happen at publish, in the relay
		modes:       []Mode{FailAfterCommit, LoseAck, OutOfOrder, HoldPastDeadline},
		ackDeadline: n.cfg.AckWait,
		window:      n.cfg.DuplicateWindow,
		retryAfter:  cfg.RetryAfter,
	}}, nil
}

// Run handles deliveries until ctx is done. It keeps pull requests open
// all the time (JetStream's message iterator, with heartbeats), so a
// delivery waits for no fetch cycle.
func (c *NATSConsumer) Run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := c.consume(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("events: consuming stopped; starting again", "consumer", c.h.Consumer(), "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(c.cfg.Wait):
			}
		}
	}
}

func (c *NATSConsumer) consume(ctx context.Context) error {
	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.cfg.Batch))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	// Up to Workers deliveries at once, one lane each: the deliveries of
	// one aggregate (HeaderKey) always take the same lane, so this instance
	// has at most one of them in flight and handles them in the order
	// JetStream delivered them. That is all a pull consumer shared by
	// several instances can promise: another instance may hold the next
	// one, and a Nak'd delivery comes back behind later ones — the consumer
	// that needs order checks it (History). Stopping waits for those in
	// flight (a delivery cut short is not acked, so it comes again).
	var inFlight sync.WaitGroup
	lanes := make([]chan jetstream.Msg, c.cfg.Workers)
	for i := range lanes {
		lanes[i] = make(chan jetstream.Msg)
		inFlight.Go(func() {
			for msg := range lanes[i] {
				c.deliver(ctx, msg)
			}
		})
	}
	defer func() {
		for _, l := range lanes {
			close(l)
		}
		inFlight.Wait()
	}()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			it.Stop()
			return err
		}
		lanes[laneOf(msg.Headers().Get(HeaderKey), len(lanes))] <- msg
	}
}

// laneOf is the lane of an aggregate's deliveries.
func laneOf(key string, lanes int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(lanes))
}

// runOnce fetches one batch (waiting up to Wait) and handles it; it
// returns how many deliveries it handled. Tests use it to take exactly one
// step; Run keeps pulling instead.
func (c *NATSConsumer) runOnce(ctx context.Context) (int, error) {
	batch, err := c.cons.Fetch(c.cfg.Batch, jetstream.FetchMaxWait(c.cfg.Wait))
	if err != nil {
		return 0, err
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		c.deliver(ctx, msg)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return n, err
	}
	return n, nil
}

func (c *NATSConsumer) deliver(ctx context.Context, msg jetstream.Msg) {
	var m Message
	if err := json.Unmarshal(msg.Data(), &m); err != nil {
		// Not an event this app wrote: acknowledged, so it is not
		// redelivered for ever, and logged.
		c.cfg.Logger.Error("events: undecodable message acknowledged", "subject", msg.Subject(), "err", err)
		msg.Term()
		return
	}
	attempt := 1
	if md, err := msg.Metadata(); err == nil {
		attempt = int(md.NumDelivered)
	}
	v := process(ctx, c.h, c.cfg.Injector, c.side, Delivery{Message: m, Attempt: attempt})
	var err error
	switch {
	case v.ack:
		err = msg.Ack()
	case v.redeliver && v.delay > 0:
		err = msg.NakWithDelay(v.delay)
	case v.redeliver:
		err = msg.Nak()
	}
	if err != nil {
		// The ack is lost: JetStream redelivers after AckWait and the inbox
		// answers "duplicate". Nothing else to do.
		c.cfg.Logger.Warn("events: ack not sent", "consumer", c.h.Consumer(), "event", m.ID, "err", err)
	}
}

// DeleteStream removes the stream and its consumers (tests clean up with
// it; the app never calls it).
func (n *NATS) DeleteStream(ctx context.Context) error {
	return n.js.DeleteStream(ctx, n.cfg.Stream)
}
