package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/fault"
	tasksfake "github.com/idemlab/idemlab/internal/tasks/fake"
)

// The Cloud Tasks transport (EVENTS_TRANSPORT=tasks): the relay creates a
// task per event and consumer in the task queue, and the queue pushes each
// to the app's push handler (events.PushPath, served by every `web serve`).
// The queue is the fake (internal/tasks/fake): in the process that runs the
// events workers, on a listener and pool of its own, unless TASKS_URL
// points at one elsewhere — `web tasks` alone, the compose service.

// tasksConfig is the TASKS_* environment (docs/api.md).
type tasksConfig struct {
	URL  string // TASKS_URL: the queue's API; empty: the fake runs here
	Addr string // TASKS_ADDR: where the fake listens when it runs here or alone
	// PushURL (TASKS_PUSH_URL) is where the queue pushes: this instance's
	// own address when empty (`web serve`), a load balancer over the
	// instances in compose.
	PushURL string
	// PushToken (TASKS_PUSH_TOKEN) is the bearer every push carries and
	// the push handler checks. Instances sharing a push URL must share it;
	// unset, each process makes one up (pushes then reach only tasks this
	// process created).
	PushToken    string
	tokenMadeUp  bool
	DedupeWindow time.Duration // TASKS_DEDUPE_WINDOW: the fake's creation dedupe window
	MaxAttempts  int           // TASKS_MAX_ATTEMPTS: pushes before a task is dropped
	// databaseURL and maxConns are for the fake's own pool, when it runs here.
	databaseURL string
	maxConns    int32
}

func loadTasksConfig(getenv func(string) string, databaseURL string) (tasksConfig, error) {
	tc := tasksConfig{
		URL:         strings.TrimRight(getenv("TASKS_URL"), "/"),
		Addr:        cmp.Or(getenv("TASKS_ADDR"), "127.0.0.1:8084"),
		PushURL:     strings.TrimRight(getenv("TASKS_PUSH_URL"), "/"),
		PushToken:   getenv("TASKS_PUSH_TOKEN"),
		databaseURL: databaseURL,
		maxConns:    8,
	}
	if tc.PushToken == "" {
		b := make([]byte, 16)
		rand.Read(b)
		tc.PushToken, tc.tokenMadeUp = hex.EncodeToString(b), true
	}
	var err error
	// 2 minutes, as EVENTS_DUPLICATE_WINDOW: short enough that the
	// injector's after_window can be watched (Cloud Tasks' is about an hour).
	if tc.DedupeWindow, err = durationEnv(getenv, "TASKS_DEDUPE_WINDOW", 2*time.Minute); err != nil {
		return tc, err
	}
	n, err := intEnv(getenv, "TASKS_MAX_ATTEMPTS", 100)
	if err == nil && (n < 1 || n > 1000) {
		err = fmt.Errorf("TASKS_MAX_ATTEMPTS: %d is not from 1 to 1000", n)
	}
	tc.MaxAttempts = int(n)
	return tc, err
}

// pushHandler is the push route's handler, for every `web serve`.
func (er *eventsRuntime) pushHandler() (http.Handler, error) {
	tc := er.cfg.Tasks
	if tc.tokenMadeUp && er.cfg.Transport == events.TransportTasks {
		er.logger.Warn("TASKS_PUSH_TOKEN is unset: the queue's pushes are accepted only for tasks this process created")
	}
	p, err := events.NewTasksPush(er.handlers(), events.TasksPushConfig{Token: tc.PushToken,
		DispatchDeadline: er.cfg.AckWait, DedupeWindow: tc.DedupeWindow, Injector: er.injector, Logger: er.logger})
	if err != nil {
		return nil, err
	}
	return p.Handler(), nil
}

// runTasks runs the relay to the task queue (and the fake queue itself,
// when no TASKS_URL names one). The consumers are the push handler.
func (er *eventsRuntime) runTasks(ctx context.Context) {
	tc := er.cfg.Tasks
	if tc.PushURL == "" {
		er.logger.Error("events: tasks: no push URL (TASKS_PUSH_URL)")
		return
	}
	queueURL := tc.URL
	var wg sync.WaitGroup
	defer wg.Wait()
	if queueURL == "" {
		pool, err := database.WaitFor(ctx, er.logger, "task queue", func(ctx context.Context) (*pgxpool.Pool, error) {
			return database.Open(ctx, tc.databaseURL, tc.maxConns)
		})
		if err != nil {
			return
		}
		defer pool.Close()
		started := make(chan string, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := serveTaskQueue(ctx, pool, tc, er.cfg.AckWait, er.instance, fault.Access{}, er.logger, started)
			if err != nil {
				er.logger.Error("events: task queue", "err", err)
			}
		}()
		select {
		case queueURL = <-started:
		case <-ctx.Done():
			return
		}
	}
	pub, err := events.NewTasks(events.TasksConfig{QueueURL: queueURL, PushURL: tc.PushURL + strings.TrimSuffix(events.PushPath, "/"),
		PushToken: tc.PushToken, DispatchDeadline: er.cfg.AckWait, DedupeWindow: tc.DedupeWindow})
	if err != nil {
		er.broker.Away(err)
		er.logger.Error("events: tasks", "err", err)
		return
	}
	defer pub.Close()
	er.broker.Answering()
	relay, err := er.relay(pub)
	if err != nil {
		er.logger.Error("events: relay", "err", err)
		return
	}
	wg.Add(1)
	go func() { defer wg.Done(); er.broker.Watch(ctx, pub.Ping, brokerPingEvery) }() // away later, as NATS's callbacks say
	relay.Run(ctx)
}

// serveTaskQueue runs the fake task queue — its API on tc.Addr and its
// dispatcher — until ctx is done, and sends its URL on started once it
// listens.
func serveTaskQueue(ctx context.Context, pool *pgxpool.Pool, tc tasksConfig, deadline time.Duration, instance string,
	control fault.Access, logger *slog.Logger, started chan<- string) error {
	q, err := tasksfake.New(pool, tasksfake.Config{Instance: instance, DedupeWindow: tc.DedupeWindow,
		MaxAttempts: tc.MaxAttempts, DispatchDeadline: deadline, Control: control,
		Logger: logger.With("component", "fake-tasks")})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", tc.Addr)
	if err != nil {
		return fmt.Errorf("task queue: listen %s: %w", tc.Addr, err)
	}
	srv := &http.Server{Handler: q.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + dialable(ln.Addr())
	logger.Info("task queue (fake) listening", "url", url, "dedupe_window", tc.DedupeWindow)
	started <- url
	dispatched := make(chan struct{})
	go func() { defer close(dispatched); q.Run(ctx) }()
	select {
	case err = <-served:
	case <-ctx.Done():
	}
	<-dispatched
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(shutdownCtx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// tasksOnly is `web tasks`: the fake task queue alone (its API and its
// dispatcher), for compose and for several app instances sharing one
// queue: each sets TASKS_URL to its address.
func tasksOnly(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()
	started := make(chan string, 1)
	go func() {
		select {
		case url := <-started:
			fmt.Fprintf(stdout, "task queue listening on %s\n", url)
		case <-ctx.Done():
		}
	}()
	return serveTaskQueue(ctx, pool, cfg.Events.Tasks, cfg.Events.AckWait, cmp.Or(cfg.InstanceID, "tasks"),
		cfg.fakeControlAccess(), logger, started)
}
