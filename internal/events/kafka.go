package events

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemlab/idemlab/internal/pause"
)

// Kafka is the transport of a partitioned log: the relay produces each
// event to one topic with its aggregate as the record key (one aggregate,
// one partition, one order) and its event id in the HeaderEventID header; each consumer is a consumer group whose instances
// share the topic's partitions and commit their offsets only after the
// effect's transaction committed.
//
// What Kafka dedupes, and what it does not: the idempotent producer (on by
// default in franz-go) numbers each batch under a producer id the broker
// hands out per producer session, so a batch the client retries after a lost
// produce response is stored once. That covers the client's own retries and
// nothing else: a relay that crashes between the broker's ack and its mark
// starts a new session with a new producer id, and its second produce of the
// same event is a new record. Kafka has no dedupe window on the event id at
// all (DuplicateWindow is 0) — the consumer's inbox is the only layer that
// recognises the event.
//
// Redelivery is by offset, not per message: a group remembers one
// committed offset per partition, and committing offset n+1 acknowledges
// every record before it. So a consumer commits only what it handled, in
// order, and a delivery the rule did not finish is delivered again by
// seeking the partition back to it (this instance), or — when the member's
// session ends before its commit (a crash, a lost commit, a rebalance) — by
// the partition's next owner starting at the committed offset.
type Kafka struct {
	cfg      KafkaConfig
	producer *kgo.Client
}

// HeaderEventID carries the producer's event id on every record: what a
// consumer dedupes on, never the offset (the record key is the aggregate).
const HeaderEventID = "idemlab-event-id"

// KafkaConfig says where the brokers are and how the topic and groups
// behave. Zero fields take the defaults.
type KafkaConfig struct {
	// Brokers are the seed brokers (KAFKA_BROKERS, or the embedded broker).
	Brokers []string
	// Topic every event is produced to. Default idemlab.events. Each
	// consumer's group is "<Topic>.<consumer>".
	Topic string
	// Partitions the topic is created with. Default 4.
	Partitions int32
	// SessionTimeout: a member that sends no heartbeat for this long (a
	// killed process) is removed from its group and its partitions are
	// handed on. Default 10s; the broker's minimum is usually 6s.
	SessionTimeout time.Duration
	// PollInterval is Kafka's ack deadline (the Java client's
	// max.poll.interval.ms): an instance that has not finished the records
	// it polled within it leaves its group, so the partitions go to another
	// instance, which starts at the committed offset. Default 30s.
	PollInterval time.Duration
	// PublishTimeout bounds one batch's produce. Default 5s.
	PublishTimeout time.Duration
	Logger         *slog.Logger
}

func (c KafkaConfig) withDefaults() KafkaConfig {
	c.Topic = cmp.Or(c.Topic, "idemlab.events")
	c.Partitions = cmp.Or(c.Partitions, 4)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, 10*time.Second)
	c.PollInterval = cmp.Or(c.PollInterval, 30*time.Second)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, 5*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// NewKafka connects the producer and creates the topic (an existing topic
// is kept as it is). The app calls it at start; it is idempotent.
func NewKafka(ctx context.Context, cfg KafkaConfig) (*Kafka, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("events: kafka: no brokers")
	}
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(kafkaLogger{cfg.Logger}),
		// The idempotent producer is franz-go's default; it needs acks from
		// every in-sync replica, which is the default too. Said here so the
		// reader sees what the relay relies on (see the type's comment).
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(cfg.PublishTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("events: kafka producer: %w", err)
	}
	k := &Kafka{cfg: cfg, producer: producer}
	if err := k.createTopic(ctx); err != nil {
		producer.Close()
		return nil, err
	}
	return k, nil
}

func (k *Kafka) createTopic(ctx context.Context) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic = k.cfg.Topic
	t.NumPartitions = k.cfg.Partitions
	t.ReplicationFactor = -1 // the broker's default
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, k.producer)
	if err != nil {
		return fmt.Errorf("events: kafka topic %s: %w", k.cfg.Topic, err)
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("events: kafka topic %s: %w", k.cfg.Topic, err)
		}
	}
	return nil
}

// Close ends the producer's session (its producer id dies with it).
func (k *Kafka) Close() { k.producer.Close() }

// Ping asks the brokers whether one answers (BrokerState.Watch).
func (k *Kafka) Ping(ctx context.Context) error { return k.producer.Ping(ctx) }

// Transport names it.
func (k *Kafka) Transport() string { return TransportKafka }

// DuplicateWindow is 0: Kafka never recognises an event id; the idempotent
// producer's sequence numbers only cover one session's retries.
func (k *Kafka) DuplicateWindow() time.Duration { return 0 }

// Topic is the topic the events go to.
func (k *Kafka) Topic() string { return k.cfg.Topic }

// Publish produces every message, then waits for each one's ack (from every
// in-sync replica). The record key is the aggregate ("policy:42"): the
// partitioner sends one key to one partition, so one aggregate's events are
// stored in the order they were produced, read by one member of a group at
// a time, in offset order — and a copy of an event lands behind it. The
// event id travels in HeaderEventID.
func (k *Kafka) Publish(ctx context.Context, ms []Message) []PublishResult {
	results := make([]PublishResult, len(ms))
	ctx, cancel := context.WithTimeout(ctx, k.cfg.PublishTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, m := range ms {
		data, err := json.Marshal(m)
		if err != nil {
			results[i].Err = err
			continue
		}
		r := &kgo.Record{Topic: k.cfg.Topic, Key: []byte(m.Key), Value: data,
			Headers: []kgo.RecordHeader{{Key: HeaderEventID, Value: []byte(m.ID.String())}}}
		if m.Traceparent != "" { // for tools that read traces off headers; the consumer reads the message's
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderTraceparent, Value: []byte(m.Traceparent)})
		}
		wg.Add(1)
		k.producer.Produce(ctx, r, func(_ *kgo.Record, err error) {
			results[i].Err = err // each promise writes its own slot
			wg.Done()
		})
	}
	wg.Wait()
	return results
}

// KafkaConsumer is one instance of a consumer: a member of the consumer's
// group. Several instances share the topic's partitions; each partition is
// read by one member at a time, in order.
type KafkaConsumer struct {
	k    *Kafka
	h    *Handler
	cfg  ConsumerConfig
	side transportSide
	// seen counts this instance's deliveries of each record (Kafka keeps
	// no delivery count): a record fetched again after a seek back.
	mu   sync.Mutex
	seen map[recordAt]int
}

type recordAt struct {
	partition int32
	offset    int64
}

// Consumer returns an instance of h's consumer on k.
func (k *Kafka) Consumer(h *Handler, cfg ConsumerConfig) *KafkaConsumer {
	cfg = cfg.withDefaults()
	return &KafkaConsumer{k: k, h: h, cfg: cfg, seen: map[recordAt]int{}, side: transportSide{
		// deliver_twice and after_window happen at publish, in the relay
		modes:       []Mode{FailAfterCommit, LoseAck, OutOfOrder, HoldPastDeadline},
		ackDeadline: k.cfg.PollInterval,
		window:      0,
		retryAfter:  cfg.RetryAfter,
	}}
}

// Group is the consumer group of h's consumer.
func (k *Kafka) Group(consumer string) string { return k.cfg.Topic + "." + consumer }

// Run handles deliveries until ctx is done, one group session after
// another. A session ends when its member leaves: a commit was lost on
// purpose (then the next one joins), or its poll deadline passed while it
// was on a record — then the next member joins at once, while the old one
// finishes that record and commits nothing (its partitions are the new
// members' now, from the committed offset).
func (c *KafkaConsumer) Run(ctx context.Context) {
	var sessions sync.WaitGroup
	defer sessions.Wait()
	for ctx.Err() == nil {
		left := make(chan struct{})
		done := make(chan error, 1)
		sessions.Add(1)
		go func() { defer sessions.Done(); done <- c.session(ctx, left) }()
		select {
		case <-left:
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				c.cfg.Logger.Warn("events: kafka session ended; joining again", "consumer", c.h.Consumer(), "err", err)
				pause.For(ctx, c.cfg.Wait)
			}
		}
	}
}

// session is one membership of the group: poll, handle, commit, until ctx
// is done or the member leaves. left is closed when the member leaves at
// its poll deadline.
func (c *KafkaConsumer) session(ctx context.Context, left chan<- struct{}) error {
	cl, err := c.join()
	if err != nil {
		return err
	}
	defer cl.Close() // leaves the group: its partitions go to the other members
	var once sync.Once
	leave := func() {
		//lint:ignore SA1012 franz-go's documented way to start leaving without waiting
		cl.LeaveGroupContext(nil) // nil: start leaving, do not wait
		once.Do(func() { close(left) })
	}
	for ctx.Err() == nil {
		if _, end, err := c.pollOnce(ctx, cl, leave); err != nil || end != "" {
			if end != "" {
				c.cfg.Logger.Info("events: kafka member leaves its group", "consumer", c.h.Consumer(), "why", end)
			}
			return err
		}
	}
	return nil
}

// join makes a new member of the consumer's group.
func (c *KafkaConsumer) join() (*kgo.Client, error) {
	kc := c.k.cfg
	return kgo.NewClient(
		kgo.SeedBrokers(kc.Brokers...),
		kgo.WithLogger(kafkaLogger{c.cfg.Logger}),
		kgo.ConsumerGroup(c.k.Group(c.h.Consumer())),
		kgo.ConsumeTopics(kc.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // a new group reads the topic from its start
		kgo.DisableAutoCommit(),                           // offsets are committed after the effect (handle)
		kgo.SessionTimeout(kc.SessionTimeout),
		// A rebalance waits this long for every member to rejoin. The
		// default minute outlives the clients' own join timeouts once
		// members die and restart: each retried join restarts the wait
		// and the group never settles (seen with kfake under chaos:
		// JoinGroup i/o timeouts for the whole drain). A member that has
		// not rejoined within a session timeout is as good as gone.
		kgo.RebalanceTimeout(kc.SessionTimeout),
		kgo.HeartbeatInterval(min(kc.SessionTimeout/5, time.Second)),
		kgo.FetchMaxWait(c.cfg.Wait),
	)
}

// pollOnce waits for records (until ctx is done) and handles them. It
// returns how many it was given and why the session must end ("" if not).
func (c *KafkaConsumer) pollOnce(ctx context.Context, cl *kgo.Client, leave func()) (int, string, error) {
	fetches := cl.PollRecords(ctx, c.cfg.Batch)
	if ctx.Err() != nil {
		return 0, "", nil
	}
	if fetches.IsClientClosed() {
		return 0, "", errors.New("client closed")
	}
	fetches.EachError(func(topic string, p int32, err error) {
		c.cfg.Logger.Warn("events: kafka fetch", "topic", topic, "partition", p, "err", err)
	})
	records := fetches.Records()
	return len(records), c.handle(ctx, cl, records, leave), nil
}

// runOnce joins, handles one poll that brought records (waiting up to
// Wait for it), and leaves.
// Tests use it to take exactly one step; Run keeps its membership instead.
func (c *KafkaConsumer) runOnce(ctx context.Context) (int, error) {
	cl, err := c.join()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Wait)
	defer cancel()
	for ctx.Err() == nil { // a poll may bring only a fetch error (the topic not known yet)
		//lint:ignore SA1012 as in Run: start leaving, do not wait
		n, _, err := c.pollOnce(ctx, cl, func() { cl.LeaveGroupContext(nil) })
		if n > 0 || err != nil {
			return n, err
		}
	}
	return 0, nil
}

// handle runs one poll's records through the consumer rule, in order per
// partition, then commits the offsets of those handled. It returns why the
// session must end, or "".
func (c *KafkaConsumer) handle(ctx context.Context, cl *kgo.Client, records []*kgo.Record, leave func()) (end string) {
	if len(records) == 0 {
		return ""
	}
	// The poll deadline: an instance on one record longer than PollInterval
	// leaves its group, as the Java client does when max.poll.interval.ms
	// passes between two polls, and its partitions are handed on.
	const deadlinePassed = "its poll deadline passed while it handled a record"
	var left atomic.Bool
	watchdog := time.AfterFunc(c.k.cfg.PollInterval, func() {
		left.Store(true)
		leave()
	})

	type rewind struct {
		offset int64
		delay  time.Duration
	}
	var handled []*kgo.Record // to commit
	stopped := map[int32]rewind{}
	for _, r := range records {
		// The deadline runs per record: one record held past it is what
		// hands the partitions on, not a long batch of quick ones.
		if !watchdog.Stop() || left.Load() {
			return deadlinePassed // a member that left commits nothing: the next owner starts at the committed offset
		}
		watchdog.Reset(c.k.cfg.PollInterval)
		if _, ok := stopped[r.Partition]; ok {
			continue // behind a record that goes again: fetched again after it
		}
		var m Message
		if err := json.Unmarshal(r.Value, &m); err != nil {
			// Not an event this app wrote: committed past, so it does not
			// block its partition for ever, and logged.
			c.cfg.Logger.Error("events: undecodable kafka record skipped", "partition", r.Partition, "offset", r.Offset, "err", err)
			handled = append(handled, r)
			continue
		}
		d := Delivery{Message: m, Attempt: c.attempt(ctx, r, m), Via: fmt.Sprintf("partition %d offset %d", r.Partition, r.Offset)}
		v := process(ctx, c.h, c.cfg.Injector, c.side, d)
		switch {
		case v.ack:
			handled = append(handled, r)
		case v.silent:
			// The commit is lost: it never reaches the broker, and the
			// member goes before a later commit could cover it (offsets
			// are cumulative). The partition's next owner starts at the
			// committed offset: this record again.
			stopped[r.Partition] = rewind{offset: -1}
			end = "an offset commit was lost"
		default:
			stopped[r.Partition] = rewind{offset: r.Offset, delay: v.delay}
		}
	}
	if !watchdog.Stop() {
		return deadlinePassed
	}
	if len(handled) > 0 {
		// After the effects' commits, never before: a crash in between
		// (consumer_after_commit_before_ack fired in Handle) leaves the
		// offset behind, and the next owner's redelivery meets the inbox.
		if err := cl.CommitRecords(ctx, handled...); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("events: kafka offset commit failed; the records go again", "consumer", c.h.Consumer(), "err", err)
		}
	}
	for p, rw := range stopped {
		if rw.offset < 0 {
			continue
		}
		// Send the partition back to the record: it is fetched again from
		// the broker's log, after the delay (records behind it wait: Kafka
		// keeps order within a partition; other partitions go on).
		tp := map[string][]int32{c.k.cfg.Topic: {p}}
		if rw.delay > 0 {
			cl.PauseFetchPartitions(tp)
			time.AfterFunc(rw.delay, func() { cl.ResumeFetchPartitions(tp) })
		}
		cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{c.k.cfg.Topic: {p: {Epoch: -1, Offset: rw.offset}}})
	}
	return end
}

// attempt is this delivery's number as far as anyone can tell: Kafka keeps
// no count, so it is this instance's own, or — for a record another
// instance had (a rebalance handed it on) — one more than the deliveries
// recorded for it, asked only while the injector may act on it.
func (c *KafkaConsumer) attempt(ctx context.Context, r *kgo.Record, m Message) int {
	c.mu.Lock()
	at := recordAt{r.Partition, r.Offset}
	c.seen[at]++
	n := c.seen[at]
	if len(c.seen) > 100000 { // a bound, not a cache: the count is informational
		clear(c.seen)
	}
	c.mu.Unlock()
	if n == 1 && !c.cfg.Injector.quiet() {
		if prior, err := c.h.priorDeliveries(ctx, m.ID); err == nil {
			n = max(n, prior+1)
		}
	}
	return n
}

// kafkaLogger sends franz-go's warnings and errors to slog.
type kafkaLogger struct{ l *slog.Logger }

func (kafkaLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kafkaLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelError {
		k.l.Error("kafka: "+msg, keyvals...)
		return
	}
	k.l.Warn("kafka: "+msg, keyvals...)
}
