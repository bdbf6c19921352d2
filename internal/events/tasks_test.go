package events_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/tasks"
	"github.com/idemlab/idemlab/internal/tasks/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

const pushToken = "test-push-token"

// tasksSide is a bundle's Cloud Tasks peer: the fake queue over HTTP (its
// API on a server of its own, its dispatcher running), and the front the
// queue pushes to — a round-robin proxy over the push handlers' servers,
// as a load balancer over app instances.
type tasksSide struct {
	queue    *fake.Queue
	queueCfg fake.Config
	client   *tasks.Client
	front    *pushFront
	cfg      events.TasksConfig
}

// pushFront hands each push to the next instance's server in turn. With
// no instance up it answers 503 (the queue pushes again later). A backend
// that drops the connection drops the front's too: the queue sees no
// answer, as it would from the instance itself.
type pushFront struct {
	srv      *httptest.Server
	mu       sync.Mutex
	backends []*httputil.ReverseProxy
	next     atomic.Uint64
}

func newPushFront(t testing.TB) *pushFront {
	f := &pushFront{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		n := len(f.backends)
		var p *httputil.ReverseProxy
		if n > 0 {
			p = f.backends[f.next.Add(1)%uint64(n)]
		}
		f.mu.Unlock()
		if p == nil {
			http.Error(w, "no instance up", http.StatusServiceUnavailable)
			return
		}
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *pushFront) add(backend string) {
	u, _ := url.Parse(backend)
	p := httputil.NewSingleHostReverseProxy(u)
	p.ErrorLog = nil
	p.ErrorHandler = func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) }
	f.mu.Lock()
	f.backends = append(f.backends, p)
	f.mu.Unlock()
}

// setupTasks returns a fresh database whose events travel on Cloud Tasks:
// the fake queue (on the same database server, its own schema) pushing to
// a front with no instance behind it yet (startConsumers adds them).
func setupTasks(t testing.TB, qcfg fake.Config) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{db: testdb.New(t), transport: events.TransportTasks}
	b.injector = events.NewInjector(b.db.Pool)
	b.userID = demoUser(t, b.db)
	if err := events.SetTransport(ctx, b.db.Pool, events.TransportTasks); err != nil {
		t.Fatal(err)
	}
	qcfg.DispatchDeadline = cmp.Or(qcfg.DispatchDeadline, 2*time.Second) // the ack deadline: a push slower than it (a loaded machine) would be one duplicate too many
	qcfg.DedupeWindow = cmp.Or(qcfg.DedupeWindow, time.Hour)
	qcfg.MinBackoff = cmp.Or(qcfg.MinBackoff, 300*time.Millisecond) // long enough for out_of_order's overtaking
	qcfg.MaxBackoff = cmp.Or(qcfg.MaxBackoff, time.Second)
	qcfg.Interval = cmp.Or(qcfg.Interval, 50*time.Millisecond)
	qcfg.LeaseMargin = cmp.Or(qcfg.LeaseMargin, 500*time.Millisecond)
	qcfg.Logger = slog.New(slog.DiscardHandler)
	q, err := fake.New(b.db.Pool, qcfg)
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(q.Handler())
	t.Cleanup(api.Close)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); q.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	ts := &tasksSide{queue: q, queueCfg: qcfg, client: tasks.NewClient(api.URL, 5*time.Second), front: newPushFront(t)}
	// The publisher's window is what the relay's after_window waits out
	// from the create; the queue's starts when the task ran. The margin is
	// the time to run it on a loaded machine.
	ts.cfg = events.TasksConfig{QueueURL: api.URL, PushURL: ts.front.srv.URL + strings.TrimSuffix(events.PushPath, "/"),
		PushToken: pushToken, DispatchDeadline: qcfg.DispatchDeadline, DedupeWindow: qcfg.DedupeWindow + 3*time.Second}
	pub, err := events.NewTasks(ts.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	b.tasks, b.pub = ts, pub
	return b
}

// startPushHandlers starts `instances` app instances' push handlers (each
// on a server of its own, behind the front) until the test ends; sw, if
// set, is the first instance's crash switch.
func (b *bundle) startPushHandlers(t testing.TB, instances int, sw *crash.Switch) {
	t.Helper()
	for i := range instances {
		var hs []*events.Handler
		for _, c := range []events.Consumer{events.Notifications{}, events.Ledger{}, events.History{}} {
			cfg := events.HandlerConfig{Transport: events.TransportTasks, Instance: fmt.Sprintf("instance-%d", i+1)}
			if i == 0 {
				cfg.Crash = sw
			}
			hs = append(hs, events.NewHandler(b.db.Pool, c, cfg))
		}
		push, err := events.NewTasksPush(hs, events.TasksPushConfig{Token: pushToken, Injector: b.injector,
			DispatchDeadline: b.tasks.queueCfg.DispatchDeadline, DedupeWindow: b.tasks.queueCfg.DedupeWindow})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(push.Handler())
		t.Cleanup(srv.Close)
		b.tasks.front.add(srv.URL)
	}
}

// The relay creates one task per event and consumer, named by the event
// id; the queue pushes each to the two instances in turn; each event is
// applied once per consumer, and every push says which task it was.
func TestTasksEveryEventAppliedOncePerConsumer(t *testing.T) {
	t.Parallel()
	b := setupTasks(t, fake.Config{})
	b.startConsumers(t, 2)
	ids := b.write(t, 12)
	c, err := b.relay(t, events.RelayConfig{Batch: 5}).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Claimed != 12 || c.Published != 12 || c.Duplicates != 0 {
		t.Errorf("relay pass = %+v, want 12 claimed and published, no duplicates", c)
	}
	b.waitApplied(t, ids, 20*time.Second)
	var instances, named int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT (consumer, instance)) FROM event_deliveries`).Scan(&instances)
	b.db.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM event_deliveries WHERE detail LIKE 'task ' || event_id || ' retry 0%'`).Scan(&named)
	if want := len(events.Consumers); instances != 2*want || named != 12*want {
		t.Errorf("%d (consumer, instance) pairs, %d deliveries naming their task; want %d and %d", instances, named, 2*want, 12*want)
	}
	for _, consumer := range events.Consumers {
		got, err := b.tasks.client.Get(context.Background(), b.pub.(*events.Tasks).Queue(consumer)+"/tasks/"+ids[0].String())
		if err != nil {
			t.Fatal(err)
		}
		if got.State != tasks.StateSucceeded || got.DispatchCount != 1 {
			t.Errorf("%s task of %s: %s after %d pushes, want SUCCEEDED after 1", consumer, ids[0], got.State, got.DispatchCount)
		}
	}
}

// The relay dies after the queue created the tasks and before it marked
// the rows: the next relay creates them again by the same names, and the
// queue refuses every one (ALREADY_EXISTS, inside its window) — the
// queue's layer catches the repeat, nothing reaches a consumer twice.
func TestTasksRelayCrashAfterPublishBeforeMarkIsRefusedByName(t *testing.T) {
	t.Parallel()
	// A push past the harness's 2s deadline is pushed again and caught by
	// the inbox (correct, but not what this test counts): a loaded machine
	// made one. Nothing here needs a short deadline.
	b := setupTasks(t, fake.Config{DispatchDeadline: 30 * time.Second})
	ctx := context.Background()
	ids := b.write(t, 3)
	dying := b.relay(t, events.RelayConfig{Lease: 200 * time.Millisecond,
		Crash: abandonAt(t, events.CrashRelayAfterPublishBeforeMark)})
	if !crashed(func() { dying.RunOnce(ctx) }) {
		t.Fatal("the relay did not reach its crash point")
	}
	b.startConsumers(t, 2)
	b.waitApplied(t, ids, 20*time.Second) // the tasks exist: the queue pushes them meanwhile
	time.Sleep(300 * time.Millisecond)    // the dead relay's lease runs out
	c, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Published != 3 || c.Duplicates != 3 {
		t.Errorf("second relay = %+v, want 3 published, all 3 refused by the queue", c)
	}
	for _, id := range ids {
		if d := b.deliveries(t, id); d[events.OutcomeDuplicate] != 0 {
			t.Errorf("event %s: %d inbox duplicates, want 0 (the queue refused the copies)", id, d[events.OutcomeDuplicate])
		}
	}
	b.assertOnce(t, ids)
}

// The instance dies after its effect committed and before it answered the
// push: the queue hears nothing, pushes again (to the other instance, or
// this one), and the inbox answers "applied already".
func TestTasksConsumerCrashAfterCommitBeforeAnswer(t *testing.T) {
	t.Parallel()
	b := setupTasks(t, fake.Config{})
	b.startPushHandlers(t, 2, abandonAt(t, events.CrashConsumerAfterCommitBeforeAck))
	ids := b.write(t, 4)
	if _, err := b.relay(t, events.RelayConfig{}).RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.waitApplied(t, ids, 20*time.Second)
	waitFor(t, 20*time.Second, "the push after the crash to be caught by the inbox", func() bool {
		var n int
		b.db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM event_deliveries
			 WHERE event_id = ANY($1) AND outcome = 'duplicate' AND caught_by = 'inbox' AND attempt > 1`, ids).Scan(&n)
		return n == 1
	})
	b.assertOnce(t, ids)
}

// A push that times out after the handler committed (its answer never
// came back within the dispatch deadline) is pushed again with a higher
// retry count, and answered 200 "duplicate": done already.
func TestTasksPushTimedOutAfterCommitIsAnsweredAsDone(t *testing.T) {
	t.Parallel()
	b := setupTasks(t, fake.Config{})
	ctx := context.Background()
	if _, err := b.injector.Arm(ctx, events.LoseAck, events.ConsumerLedger, 1); err != nil {
		t.Fatal(err)
	}
	b.startConsumers(t, 1)
	ids := b.write(t, 1)
	if _, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitApplied(t, ids, 20*time.Second)
	name := b.pub.(*events.Tasks).TaskName(events.ConsumerLedger, events.Message{ID: ids[0]})
	var task tasks.Task
	waitFor(t, 20*time.Second, "the ledger's task to succeed", func() bool {
		var err error
		task, err = b.tasks.client.Get(ctx, name)
		return err == nil && task.State == tasks.StateSucceeded
	})
	n := len(task.Attempts)
	if n < 2 || task.Attempts[0].Status.Code != 0 || task.Attempts[n-1].Status.Code != http.StatusOK {
		t.Fatalf("attempts = %+v; want a push with no answer, then (a loaded machine may time out more) one answered 200", task.Attempts)
	}
	var outcome, detail string
	b.db.Pool.QueryRow(ctx, `
		SELECT outcome, detail FROM event_deliveries
		 WHERE event_id = $1 AND consumer = 'ledger' AND attempt = 2`, ids[0]).Scan(&outcome, &detail)
	if outcome != events.OutcomeDuplicate || !strings.Contains(detail, "retry 1") {
		t.Errorf("the retried push: %q (%q), want duplicate at retry 1", outcome, detail)
	}
	var applied int
	b.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM event_deliveries
		 WHERE event_id = $1 AND consumer = 'ledger' AND outcome = 'applied'`, ids[0]).Scan(&applied)
	if applied != 1 {
		t.Errorf("the ledger applied the event %d times over %d pushes, want once", applied, n)
	}
	b.assertOnce(t, ids)
}

// After the queue's window a create of the same name makes a new task: it
// is pushed again in full, and only the inbox stands between it and a
// second effect.
func TestTasksNameReusedAfterWindowIsANewTaskTheInboxHolds(t *testing.T) {
	t.Parallel()
	b := setupTasks(t, fake.Config{DedupeWindow: 300 * time.Millisecond})
	ctx := context.Background()
	b.startConsumers(t, 2)
	ids := b.write(t, 2)
	if _, err := b.relay(t, events.RelayConfig{}).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitApplied(t, ids, 20*time.Second)
	ms := make([]events.Message, len(ids))
	for i, id := range ids {
		ms[i] = events.Message{ID: id, Type: events.TypePolicyCancelled, Key: "policy:1", Payload: []byte(`{}`)}
	}
	time.Sleep(400 * time.Millisecond) // the window, from when the tasks ran (inside it: TestTasksRelayCrash…)
	for i, r := range b.pub.Publish(ctx, ms) {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("after the window, event %d = %+v, want new tasks", i, r)
		}
	}
	consumers := len(events.Consumers) // one task per consumer and event
	waitFor(t, 20*time.Second, "the inbox to catch every consumer's new task of every event", func() bool {
		for _, id := range ids {
			if b.deliveries(t, id)[events.OutcomeDuplicate] != consumers {
				return false
			}
		}
		return true
	})
	var rows int
	b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_tasks.tasks WHERE name = $1`, ids[0].String()).Scan(&rows)
	if rows != 2*consumers {
		t.Errorf("%d tasks named %s, want %d (each consumer's, twice)", rows, ids[0], 2*consumers)
	}
	b.assertOnce(t, ids)
}

func TestInjectorModesOnTasks(t *testing.T) {
	t.Parallel()
	for _, mode := range events.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cfg := fake.Config{}
			if mode == events.AfterWindow {
				cfg.DedupeWindow = 100 * time.Millisecond // the copy is created once the first task ran and the window passed
			}
			b := setupTasks(t, cfg)
			checkInjectedMode(t, b, mode, func(ctx context.Context) *events.Relay {
				b.startConsumers(t, 2)
				relay := b.relay(t, events.RelayConfig{})
				if _, err := relay.RunOnce(ctx); err != nil {
					t.Fatal(err)
				}
				return relay
			})
		})
	}
}

// A push without the token, to no consumer, or with a body that is not an
// event is refused and applies nothing.
func TestTasksPushRefusesBadPushes(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	h := events.NewHandler(db.Pool, events.Ledger{}, events.HandlerConfig{Transport: events.TransportTasks})
	push, err := events.NewTasksPush([]*events.Handler{h}, events.TasksPushConfig{Token: pushToken})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(push.Handler())
	defer srv.Close()
	good := fmt.Sprintf(`{"id": %q, "type": "policy.cancelled", "key": "policy:1", "payload": {}}`, uuid.New())
	for _, tc := range []struct {
		name, path, token, body string
		status                  int
	}{
		{"no token", "ledger", "", good, 401},
		{"wrong token", "ledger", "nope", good, 401},
		{"no such consumer", "mailer", pushToken, good, 404},
		{"not JSON", "ledger", pushToken, `{`, 400},
		{"no id", "ledger", pushToken, `{"type": "policy.cancelled"}`, 400},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+events.PushPath+tc.path, strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d problem+json", tc.name, resp.StatusCode, resp.Header.Get("Content-Type"), tc.status)
		}
	}
	var n int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox`).Scan(&n)
	if n != 0 {
		t.Errorf("%d inbox rows after refused pushes", n)
	}
}
