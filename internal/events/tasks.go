package events

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/tasks"
)

// Cloud Tasks is the transport that pushes: the relay creates one task per
// event and consumer, named by the event id, in that consumer's queue; the
// queue pushes the event to the app's push handler (TasksPush) until a push
// is answered 2xx. Two layers can catch a repeat:
//
//   - the queue, at creation: while a task of that name is pending, and for
//     the queue's dedupe window after it ran (about an hour on Cloud Tasks),
//     a second create is refused (ALREADY_EXISTS) — a relay that crashed
//     after creating and before marking the row creates nothing new. After
//     the window the same name makes a new task, and it is pushed again.
//   - the inbox, at delivery: the queue pushes again whenever a push failed
//     or was not answered within the dispatch deadline — including after the
//     handler committed. The retry count in the headers says nothing about
//     that; the inbox does.
//
// So the name dedupes creations for a while; deliveries are at least once,
// for ever; the consumer rule makes them one effect.
type Tasks struct {
	cfg    TasksConfig
	client *tasks.Client
}

// TasksConfig says where the queue and the push handler are. Zero fields
// take the defaults.
type TasksConfig struct {
	// QueueURL is the queue's API (the fake's, or an emulator's).
	QueueURL string
	// Project and Location name the queues (projects/{p}/locations/{l}/…).
	// Defaults idemlab and local.
	Project, Location string
	// QueuePrefix: each consumer's tasks go to queue "<prefix>-<consumer>",
	// so one consumer's retries never hold up the other's. Default events.
	QueuePrefix string
	// PushURL is the push handler's base; a consumer's tasks are pushed to
	// PushURL + "/" + consumer (PushPath on the app).
	PushURL string
	// PushToken is sent with every push as a bearer token; the push handler
	// refuses a push without it.
	PushToken string
	// DispatchDeadline is how long the queue waits for a push's answer —
	// Cloud Tasks' ack deadline. Default 30s.
	DispatchDeadline time.Duration
	// DedupeWindow is the queue's: how long after a task ran its name still
	// refuses a create (what DuplicateWindow reports). Default 1h.
	DedupeWindow time.Duration
	// CreateTimeout bounds one create call. Default 5s.
	CreateTimeout time.Duration
}

func (c TasksConfig) withDefaults() TasksConfig {
	c.Project = cmp.Or(c.Project, "idemlab")
	c.Location = cmp.Or(c.Location, "local")
	c.QueuePrefix = cmp.Or(c.QueuePrefix, "events")
	c.DispatchDeadline = cmp.Or(c.DispatchDeadline, 30*time.Second)
	c.DedupeWindow = cmp.Or(c.DedupeWindow, time.Hour)
	c.CreateTimeout = cmp.Or(c.CreateTimeout, 5*time.Second)
	return c
}

// PushPath is where the app serves the push handler: PushPath + consumer.
const PushPath = "/tasks/events/"

// NewTasks returns the publisher to the queue at cfg.QueueURL.
func NewTasks(cfg TasksConfig) (*Tasks, error) {
	cfg = cfg.withDefaults()
	if cfg.QueueURL == "" || cfg.PushURL == "" {
		return nil, errors.New("events: tasks: the queue's URL and the push URL are both needed")
	}
	for _, id := range []string{cfg.Project, cfg.Location, cfg.QueuePrefix} {
		if !tasks.ValidID(id) {
			return nil, fmt.Errorf("events: tasks: %q is not a Cloud Tasks id", id)
		}
	}
	return &Tasks{cfg: cfg, client: tasks.NewClient(cfg.QueueURL, cfg.CreateTimeout)}, nil
}

// Close closes idle connections to the queue.
func (t *Tasks) Close() { t.client.CloseIdleConnections() }

// Ping asks the queue whether it answers (BrokerState.Watch).
func (t *Tasks) Ping(ctx context.Context) error { return t.client.Ping(ctx, t.Queue(Consumers[0])) }

// Transport names it.
func (t *Tasks) Transport() string { return TransportTasks }

// DuplicateWindow is the queue's creation dedupe window.
func (t *Tasks) DuplicateWindow() time.Duration { return t.cfg.DedupeWindow }

// Queue is the resource name of consumer's queue.
func (t *Tasks) Queue(consumer string) string {
	return tasks.QueuePath(t.cfg.Project, t.cfg.Location, t.cfg.QueuePrefix+"-"+consumer)
}

// TaskName is the name of m's task for consumer: the event id, in the
// consumer's queue. The same event always gets the same name — that is
// what lets the queue refuse a second create.
func (t *Tasks) TaskName(consumer string, m Message) string {
	return t.Queue(consumer) + "/tasks/" + m.ID.String()
}

// publishConcurrency bounds the creates in flight for one batch.
const publishConcurrency = 16

// Publish creates, for every message, one task per consumer. A message is
// a Duplicate when the queue refused every one of its creates as
// ALREADY_EXISTS (it had them all: the queue's layer caught the repeat),
// and failed when any create failed otherwise — the relay then tries it
// again, and the creates that did succeed are refused by name next time.
func (t *Tasks) Publish(ctx context.Context, ms []Message) []PublishResult {
	results := make([]PublishResult, len(ms))
	type outcome struct{ created, refused int }
	outcomes := make([]outcome, len(ms))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, publishConcurrency)
	// A message twice in one batch (the injector's deliver_twice): its
	// second copy's creates wait for the first's, so the queue refuses the
	// copy as a whole rather than half of each.
	seen := map[uuid.UUID]bool{}
	var again []int
	create := func(i int) {
		m := ms[i]
		body, err := json.Marshal(m)
		if err != nil {
			results[i].Err = err
			return
		}
		headers := map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + t.cfg.PushToken}
		if m.Traceparent != "" { // the push continues the event's trace
			headers[HeaderTraceparent] = m.Traceparent
		}
		for _, consumer := range Consumers {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				_, err := t.client.Create(ctx, t.Queue(consumer), tasks.Task{
					Name: t.TaskName(consumer, m),
					HTTPRequest: tasks.HTTPRequest{URL: strings.TrimRight(t.cfg.PushURL, "/") + "/" + consumer,
						Headers: headers, Body: body},
					DispatchDeadline: tasks.Duration(t.cfg.DispatchDeadline),
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					outcomes[i].created++
				case errors.Is(err, tasks.ErrAlreadyExists):
					outcomes[i].refused++
				case results[i].Err == nil:
					results[i].Err = fmt.Errorf("events: create the %s task of %s: %w", consumer, m.ID, err)
				}
			}()
		}
	}
	for i, m := range ms {
		if seen[m.ID] {
			again = append(again, i)
			continue
		}
		seen[m.ID] = true
		create(i)
	}
	wg.Wait()
	for _, i := range again {
		create(i)
	}
	wg.Wait()
	for i, o := range outcomes {
		results[i].Duplicate = results[i].Err == nil && o.created == 0 && o.refused > 0
	}
	return results
}

// TasksPush is the app's push handler: the consumer side of the Cloud Tasks
// transport. Every push goes through the consumer rule (process, Handler)
// like a delivery on any other transport; the HTTP answer is the
// acknowledgement:
//
//	2xx          handled (applied now, or applied already: the inbox said so)
//	503          not handled, or handled and "failed" (fail_after_commit):
//	             the queue pushes again after its backoff
//	no answer    lose_ack, a crash after the commit: the dispatch deadline
//	             passes and the queue pushes again
type TasksPush struct {
	handlers map[string]*Handler
	cfg      TasksPushConfig
	side     transportSide
}

// TasksPushConfig configures the push handler.
type TasksPushConfig struct {
	// Token every push must carry (Authorization: Bearer). Required.
	Token string
	// DispatchDeadline is the queue's (the transport's ack deadline): how
	// long hold_past_deadline holds. Default 30s.
	DispatchDeadline time.Duration
	// DedupeWindow is the queue's (after_window waits it out). Default 1h.
	DedupeWindow time.Duration
	Injector     *Injector
	Logger       *slog.Logger
}

// NewTasksPush returns the push handler of handlers' consumers.
func NewTasksPush(handlers []*Handler, cfg TasksPushConfig) (*TasksPush, error) {
	if cfg.Token == "" {
		return nil, errors.New("events: tasks: the push handler needs a token")
	}
	cfg.DispatchDeadline = cmp.Or(cfg.DispatchDeadline, 30*time.Second)
	cfg.DedupeWindow = cmp.Or(cfg.DedupeWindow, time.Hour)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &TasksPush{handlers: map[string]*Handler{}, cfg: cfg, side: transportSide{
		// deliver_twice and after_window happen at publish, in the relay
		modes:       []Mode{FailAfterCommit, LoseAck, OutOfOrder, HoldPastDeadline},
		ackDeadline: cfg.DispatchDeadline,
		window:      cfg.DedupeWindow,
	}}
	for _, h := range handlers {
		p.handlers[h.Consumer()] = h
	}
	return p, nil
}

// maxPushBody bounds a pushed event.
const maxPushBody = 1 << 20

// Handler serves POST PushPath + "{consumer}".
func (p *TasksPush) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PushPath+"{consumer}", p.serve)
	return mux
}

func (p *TasksPush) serve(w http.ResponseWriter, r *http.Request) {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(p.cfg.Token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="task push"`)
		problem.Write(w, problem.New(http.StatusUnauthorized, "unauthorized", "Unauthorized",
			"a push carries the queue's bearer token (TASKS_PUSH_TOKEN)"))
		return
	}
	h := p.handlers[r.PathValue("consumer")]
	if h == nil {
		problem.Write(w, problem.New(http.StatusNotFound, "not-found", "Not found",
			"no such consumer: want one of "+strings.Join(Consumers, ", ")))
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPushBody))
	var m Message
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil || m.ID == uuid.Nil || m.Type == "" {
		problem.Write(w, problem.New(http.StatusBadRequest, "invalid-event", "Invalid event",
			"the body must be an event: {\"id\", \"type\", \"key\", \"payload\", \"created_at\"}"))
		return
	}
	// Cloud Tasks counts the pushes; the count is shown, never deduped on.
	retry, _ := strconv.Atoi(r.Header.Get(tasks.HeaderRetryCount))
	d := Delivery{Message: m, Attempt: retry + 1,
		Via: fmt.Sprintf("task %s retry %d", r.Header.Get(tasks.HeaderTaskName), retry)}
	v := process(r.Context(), h, p.cfg.Injector, p.side, d)
	switch {
	case v.ack:
		writeJSON(w, http.StatusOK, map[string]string{"event": m.ID.String(), "consumer": h.Consumer(), "outcome": v.outcome})
	case v.silent:
		// The answer never leaves: the queue's dispatch deadline passes and
		// it pushes again (bounded, in case the queue never gives up).
		select {
		case <-r.Context().Done():
		case <-time.After(2 * p.cfg.DispatchDeadline):
		}
		panic(http.ErrAbortHandler) // net/http drops the connection without an answer
	default:
		why := "not handled: the queue pushes it again"
		if v.failed && v.outcome != "" {
			why = "handled, reported failed (fail_after_commit): the queue pushes it again"
		}
		problem.Write(w, problem.New(http.StatusServiceUnavailable, "redeliver", "Push again", why))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
