package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/pause"
)

// eventsConfig is the EVENTS_* and NATS_URL environment (docs/api.md).
type eventsConfig struct {
	Transport string // EVENTS_TRANSPORT: nats, river, kafka or tasks
	// Workers (EVENTS_WORKERS, default on) runs the relay and the consumers
	// in this `web serve`. Off, the process only writes events (into the
	// outbox, in the business transactions) and `web events` elsewhere
	// delivers them — the same split as `web recover` for recovery.
	Workers bool
	NATSURL string // NATS_URL
	// NATSEmbed: NATS_URL was not set, so when nothing answers at the
	// default URL this process runs the embedded server (events.NATSServer)
	// there, its streams in NATSDataDir (NATS_DATA_DIR, "" = a temporary
	// folder) — as it runs the embedded Kafka broker without KAFKA_BROKERS.
	NATSEmbed   bool
	NATSDataDir string
	// Stream and Subject (EVENTS_STREAM, EVENTS_SUBJECT) default to names
	// carrying the database's name, so two idemlab databases sharing one
	// NATS server (the test suite's) never read each other's events.
	Stream, Subject string
	DuplicateWindow time.Duration // EVENTS_DUPLICATE_WINDOW: JetStream's Nats-Msg-Id memory
	AckWait         time.Duration // EVENTS_ACK_WAIT: JetStream's (and River's rescue) ack deadline
	Replicas        int           // EVENTS_REPLICAS: servers of a JetStream cluster keeping the stream (1 or 3, 5)
	RelayInterval   time.Duration // EVENTS_RELAY_INTERVAL: the relay's poll
	RelayLease      time.Duration // EVENTS_RELAY_LEASE: how long a claim keeps other relays off its rows
	MaxAttempts     int           // EVENTS_MAX_ATTEMPTS: failed publishes before DEAD
	Retention       time.Duration // EVENTS_RETENTION: how long SENT rows and the logs are kept
	InboxRetention  time.Duration // EVENTS_INBOX_RETENTION: how long the inboxes remember

	// Kafka. KafkaBrokers (KAFKA_BROKERS, comma-separated) names a real
	// cluster; empty, the process that runs the Kafka workers starts the
	// embedded broker (kfake) on KafkaAddr (KAFKA_ADDR), its log in
	// KafkaDataDir (KAFKA_DATA_DIR, "" = memory). Several instances share
	// one broker: `web kafka` alone, and KAFKA_BROKERS on every instance.
	KafkaBrokers        []string
	KafkaAddr           string
	KafkaDataDir        string
	Topic               string        // EVENTS_TOPIC: default idemlab.events.<database>
	KafkaPartitions     int           // EVENTS_KAFKA_PARTITIONS
	KafkaSessionTimeout time.Duration // EVENTS_KAFKA_SESSION_TIMEOUT: a silent member's partitions are handed on after it

	Tasks tasksConfig // TASKS_*: the Cloud Tasks transport (tasks.go)
}

func loadEventsConfig(getenv func(string) string, databaseURL string) (eventsConfig, error) {
	ec := eventsConfig{
		Workers: true,
		NATSURL: cmp.Or(getenv("NATS_URL"), nats.DefaultURL),
		// A NATS_URL asked for is used as given, answering or not.
		NATSEmbed:   getenv("NATS_URL") == "",
		NATSDataDir: getenv("NATS_DATA_DIR"),
		Stream:      getenv("EVENTS_STREAM"),
		Subject:     getenv("EVENTS_SUBJECT"),
		Topic:       getenv("EVENTS_TOPIC"),

		KafkaAddr:    cmp.Or(getenv("KAFKA_ADDR"), "127.0.0.1:9092"),
		KafkaDataDir: getenv("KAFKA_DATA_DIR"),
	}
	for _, b := range strings.Split(getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			ec.KafkaBrokers = append(ec.KafkaBrokers, b)
		}
	}
	var err error
	switch v := getenv("EVENTS_WORKERS"); v {
	case "", "on", "true":
	case "off", "false":
		ec.Workers = false
	default:
		return ec, fmt.Errorf("EVENTS_WORKERS: %q is neither on nor off", v)
	}
	if ec.Transport, err = events.ParseTransport(getenv("EVENTS_TRANSPORT")); err != nil {
		return ec, fmt.Errorf("EVENTS_TRANSPORT: %w", err)
	}
	db := databaseName(databaseURL)
	ec.Stream = cmp.Or(ec.Stream, "IDEMLAB_EVENTS_"+strings.ToUpper(db))
	ec.Subject = cmp.Or(ec.Subject, "idemlab.events."+db)
	ec.Topic = cmp.Or(ec.Topic, "idemlab.events."+db)
	for _, d := range []struct {
		dst  *time.Duration
		name string
		def  time.Duration
	}{
		{&ec.DuplicateWindow, "EVENTS_DUPLICATE_WINDOW", 2 * time.Minute},
		{&ec.AckWait, "EVENTS_ACK_WAIT", 30 * time.Second},
		{&ec.RelayInterval, "EVENTS_RELAY_INTERVAL", time.Second},
		{&ec.RelayLease, "EVENTS_RELAY_LEASE", 30 * time.Second},
		{&ec.Retention, "EVENTS_RETENTION", 24 * time.Hour},
		{&ec.InboxRetention, "EVENTS_INBOX_RETENTION", 30 * 24 * time.Hour},
		{&ec.KafkaSessionTimeout, "EVENTS_KAFKA_SESSION_TIMEOUT", 10 * time.Second},
	} {
		if *d.dst, err = durationEnv(getenv, d.name, d.def); err != nil {
			return ec, err
		}
	}
	n, err := intEnv(getenv, "EVENTS_MAX_ATTEMPTS", 10)
	if err != nil {
		return ec, err
	}
	ec.MaxAttempts = int(n)
	r, err := intEnv(getenv, "EVENTS_REPLICAS", 1)
	if err == nil && (r < 1 || r > 5) {
		err = fmt.Errorf("EVENTS_REPLICAS: %d is not from 1 to 5 (JetStream's limit)", r)
	}
	if err != nil {
		return ec, err
	}
	ec.Replicas = int(r)
	p, err := intEnv(getenv, "EVENTS_KAFKA_PARTITIONS", 4)
	if err == nil && (p < 1 || p > 1000) {
		err = fmt.Errorf("EVENTS_KAFKA_PARTITIONS: %d is not from 1 to 1000", p)
	}
	ec.KafkaPartitions = int(p)
	if err != nil {
		return ec, err
	}
	ec.Tasks, err = loadTasksConfig(getenv, databaseURL)
	return ec, err
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// databaseName is the database part of a PostgreSQL URL, made safe for a
// stream and subject name.
func databaseName(url string) string {
	name := "postgres"
	if i := strings.LastIndex(url, "/"); i >= 0 {
		name = strings.SplitN(url[i+1:], "?", 2)[0]
	}
	return cmp.Or(unsafeName.ReplaceAllString(strings.ToLower(name), "_"), "postgres")
}

// eventsRuntime is this process's part of the events machinery: the relay
// (NATS) or nothing to relay (River), and one instance of each consumer.
type eventsRuntime struct {
	cfg      eventsConfig
	pool     *pgxpool.Pool
	listen   *pgxpool.Pool // the relay's LISTEN: the database itself (DATABASE_DIRECT_URL)
	logger   *slog.Logger
	crash    *crash.Switch
	metrics  *events.Metrics
	injector *events.Injector
	instance string
	// broker is what the relay knows of its broker (NATS, Kafka, the task
	// queue): away or answering, for the admin pages — at setup and at any
	// time after; nil for River, whose broker is PostgreSQL.
	broker *events.BrokerState
}

func newEventsRuntime(cfg eventsConfig, pool, listen *pgxpool.Pool, instance string, sw *crash.Switch,
	metrics *events.Metrics, logger *slog.Logger) *eventsRuntime {
	er := &eventsRuntime{cfg: cfg, pool: pool, listen: listen, logger: logger, crash: sw, metrics: metrics,
		injector: events.NewInjector(pool), instance: instance}
	switch {
	case !cfg.Workers: // another process (web events) runs the relay
		er.broker = events.NewBrokerElsewhere()
	case cfg.Transport == events.TransportNATS:
		er.broker = events.NewBrokerState("NATS", cfg.NATSURL)
	case cfg.Transport == events.TransportKafka:
		er.broker = events.NewBrokerState("Kafka", cmp.Or(strings.Join(cfg.KafkaBrokers, ","), cfg.KafkaAddr))
	case cfg.Transport == events.TransportTasks:
		er.broker = events.NewBrokerState("The task queue", cmp.Or(cfg.Tasks.URL, "the embedded queue"))
	}
	return er
}

func (er *eventsRuntime) handlers() []*events.Handler {
	var hs []*events.Handler
	for _, c := range []events.Consumer{events.Notifications{}, events.Ledger{}, events.History{}} {
		hs = append(hs, events.NewHandler(er.pool, c, events.HandlerConfig{Transport: er.cfg.Transport,
			Instance: er.instance, Crash: er.crash, Metrics: er.metrics, Logger: er.logger}))
	}
	return hs
}

// Run records the transport in the database and runs this process's relay
// and consumers until ctx is done. NATS may be down at start: the
// stream is set up as soon as it answers, and the outbox keeps every event
// meanwhile.
func (er *eventsRuntime) Run(ctx context.Context) {
	for {
		err := events.SetTransport(ctx, er.pool, er.cfg.Transport)
		if err == nil {
			break
		}
		er.logger.Error("events: cannot record the transport; retrying", "err", err)
		if !pause.For(ctx, er.cfg.RelayInterval) {
			return
		}
	}
	switch er.cfg.Transport {
	case events.TransportRiver:
		er.runRiver(ctx)
	case events.TransportKafka:
		er.runKafka(ctx)
	case events.TransportTasks:
		er.runTasks(ctx)
	default:
		er.runNATS(ctx)
	}
}

// brokerPingEvery is how often a Kafka or task-queue relay asks whether its
// broker still answers (BrokerState.Watch); NATS's client says so itself.
const brokerPingEvery = 2 * time.Second

// relay returns the relay of this process's outbox rows to pub.
func (er *eventsRuntime) relay(pub events.Publisher) (*events.Relay, error) {
	return events.NewRelay(er.pool, pub, events.RelayConfig{Instance: er.instance,
		Interval: er.cfg.RelayInterval, Lease: er.cfg.RelayLease, MaxAttempts: er.cfg.MaxAttempts, Retention: er.cfg.Retention,
		InboxRetention: er.cfg.InboxRetention, Listen: er.listen, Crash: er.crash, Injector: er.injector,
		Metrics: er.metrics, Logger: er.logger})
}

// runKafka runs the relay to the topic and one member of each consumer's
// group. With no KAFKA_BROKERS it hosts the embedded broker itself.
func (er *eventsRuntime) runKafka(ctx context.Context) {
	brokers := er.cfg.KafkaBrokers
	if len(brokers) == 0 {
		broker, err := events.StartKafkaBroker(events.KafkaBrokerConfig{Addr: er.cfg.KafkaAddr, DataDir: er.cfg.KafkaDataDir})
		if err != nil {
			er.logger.Error("events: embedded kafka broker", "err", err)
			return
		}
		defer broker.Close()
		er.logger.Info("events: embedded kafka broker listening", "addr", broker.Addr(), "data_dir", er.cfg.KafkaDataDir)
		brokers = []string{broker.Addr()}
	}
	var k *events.Kafka
	for k == nil {
		var err error
		k, err = events.NewKafka(ctx, events.KafkaConfig{Brokers: brokers, Topic: er.cfg.Topic,
			Partitions: int32(er.cfg.KafkaPartitions), SessionTimeout: er.cfg.KafkaSessionTimeout,
			PollInterval: er.cfg.AckWait, Logger: er.logger})
		if err != nil {
			er.broker.Away(err)
			er.logger.Warn("events: kafka topic not ready; the outbox keeps the events meanwhile", "err", err)
			if !pause.For(ctx, 2*time.Second) {
				return
			}
		}
	}
	defer k.Close()
	er.broker.Answering()
	relay, err := er.relay(k)
	if err != nil {
		er.logger.Error("events: relay", "err", err)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(2)
	go func() { defer wg.Done(); relay.Run(ctx) }()
	go func() { defer wg.Done(); er.broker.Watch(ctx, k.Ping, brokerPingEvery) }() // away later, as NATS's callbacks say
	for _, h := range er.handlers() {
		c := k.Consumer(h, events.ConsumerConfig{Injector: er.injector, Logger: er.logger})
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx) }()
	}
	<-ctx.Done()
}

func (er *eventsRuntime) runRiver(ctx context.Context) {
	rc, err := events.NewRiverConsumers(er.pool, er.handlers(), events.RiverConfig{
		ID: er.instance + "-" + fmt.Sprint(time.Now().UnixNano()), JobTimeout: er.cfg.AckWait / 2,
		RescueAfter: er.cfg.AckWait, Injector: er.injector, Logger: er.logger,
		// A direct URL beside DATABASE_URL means the pool goes through a
		// pooler in transaction mode, where River's LISTEN would be lost.
		PollOnly: er.listen != er.pool})
	if err != nil {
		er.logger.Error("events: river consumers", "err", err)
		return
	}
	if err := rc.Start(ctx); err != nil {
		er.logger.Error("events: start river consumers", "err", err)
		return
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc.Stop(stopCtx)
}

func (er *eventsRuntime) runNATS(ctx context.Context) {
	nc, err := nats.Connect(er.cfg.NATSURL, nats.Name("idemlab "+er.instance),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		// what the admin pages say of the broker (events.BrokerState)
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			er.broker.Away(err) // in words on the pages; the error itself in the log
			if err != nil {
				er.logger.Warn("events: NATS disconnected; the outbox keeps the events meanwhile", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { er.broker.Answering() }))
	if err != nil {
		er.broker.Away(err)
		er.logger.Error("events: NATS", "url", er.cfg.NATSURL, "err", err)
		return
	}
	defer nc.Close()
	var js *events.NATS
	for js == nil {
		js, err = events.NewNATS(ctx, nc, events.NATSConfig{Stream: er.cfg.Stream, Subject: er.cfg.Subject,
			DuplicateWindow: er.cfg.DuplicateWindow, AckWait: er.cfg.AckWait, Replicas: er.cfg.Replicas})
		if err != nil {
			er.broker.Away(err)
			er.logger.Warn("events: NATS stream not ready; the outbox keeps the events meanwhile", "err", err)
			if !pause.For(ctx, 2*time.Second) {
				return
			}
		}
	}
	er.broker.Answering()
	relay, err := er.relay(js)
	if err != nil {
		er.logger.Error("events: relay", "err", err)
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() { defer wg.Done(); relay.Run(ctx) }()
	for _, h := range er.handlers() {
		c, err := js.Consumer(ctx, h, events.ConsumerConfig{Injector: er.injector, Logger: er.logger})
		if err != nil {
			er.logger.Error("events: consumer", "consumer", h.Consumer(), "err", err)
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx) }()
	}
	<-ctx.Done()
}

// embedNATS starts the embedded NATS server when the NATS transport is in
// use, NATS_URL was not set and nothing answers at its default (cfg.NATSURL),
// and points cfg at it. It returns the sentence the Events page shows about
// it ("" when the configured server is used) and what stops it.
func embedNATS(cfg *eventsConfig, logger *slog.Logger) (note string, stop func(), err error) {
	if cfg.Transport != events.TransportNATS || !cfg.NATSEmbed {
		return "", func() {}, nil
	}
	addr := strings.TrimPrefix(cfg.NATSURL, "nats://")
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		return "", func() {}, nil
	}
	srv, err := events.StartNATSServer(events.NATSServerConfig{Addr: addr, DataDir: cfg.NATSDataDir})
	if err != nil {
		return "", nil, fmt.Errorf("nothing answers at %s and the embedded NATS server did not start (set NATS_URL): %w", cfg.NATSURL, err)
	}
	logger.Info("events: nothing answers at NATS_URL's default: running an embedded NATS server with JetStream",
		"url", srv.URL(), "data_dir", srv.DataDir())
	note = fmt.Sprintf("No NATS server answered at %s and NATS_URL is unset, so this process runs an embedded NATS server "+
		"with JetStream (the server's own Go library) at %s, its streams in %s. Set NATS_URL to use another.",
		cfg.NATSURL, srv.URL(), srv.DataDir())
	cfg.NATSURL = srv.URL()
	return note, srv.Close, nil
}

// eventsOnly is `web events`: the relay and one instance of each consumer
// alone, for a worker process next to `web serve` instances started with
// EVENTS_WORKERS=off.
func eventsOnly(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	if cfg.InstanceID == "" {
		cfg.InstanceID = "events"
	}
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()
	sw := crash.New(events.CrashPoints, logger)
	if err := sw.Arm(crash.Setting{At: crash.Point(cfg.CrashAt), Mode: crash.Mode(cfg.CrashMode)}); err != nil {
		return fmt.Errorf("CRASH_AT / CRASH_MODE: %w", err)
	}
	if cfg.Events.Transport == events.TransportTasks && (cfg.Events.Tasks.PushURL == "" || cfg.Events.Tasks.tokenMadeUp) {
		return errors.New("web events with EVENTS_TRANSPORT=tasks needs TASKS_PUSH_URL and TASKS_PUSH_TOKEN: the app instances serve the pushes")
	}
	_, stopNATS, err := embedNATS(&cfg.Events, logger)
	if err != nil {
		return err
	}
	defer stopNATS()
	run := newEventsRuntime(cfg.Events, pool, direct, cfg.InstanceID, sw, events.NewMetrics(nil), logger)
	fmt.Fprintf(stdout, "events %q running (%s)\n", cfg.InstanceID, cfg.Events.Transport)
	run.Run(ctx)
	return nil
}

// kafkaOnly is `web kafka`: the embedded broker alone, for several app
// instances (and `web events` processes) sharing one broker without a real
// cluster: each sets KAFKA_BROKERS to its address.
func kafkaOnly(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	broker, err := events.StartKafkaBroker(events.KafkaBrokerConfig{Addr: cfg.Events.KafkaAddr, DataDir: cfg.Events.KafkaDataDir})
	if err != nil {
		return err
	}
	defer broker.Close()
	fmt.Fprintf(stdout, "kafka broker listening on %s\n", broker.Addr())
	logger.Info("kafka broker (embedded) running", "addr", broker.Addr(), "data_dir", cfg.Events.KafkaDataDir)
	<-ctx.Done()
	return nil
}
