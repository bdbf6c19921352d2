package fake_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/tasks"
	"github.com/idemlab/idemlab/internal/tasks/fake"
	"github.com/idemlab/idemlab/internal/testdb"
)

const queuePath = "projects/idemlab/locations/local/queues/test"

// target is the handler the queue pushes to: it records every push and
// answers with what answer says for that push.
type target struct {
	srv    *httptest.Server
	mu     sync.Mutex
	pushes []http.Header
	bodies map[string][]string // by task name
	// answer returns the status for a push of task name with retry count
	// retry; 0 means never answer (hold until the queue gives up).
	answer func(name string, retry int) int
}

func newTarget(t *testing.T, answer func(name string, retry int) int) *target {
	tg := &target{answer: answer, bodies: map[string][]string{}}
	tg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		name := r.Header.Get(tasks.HeaderTaskName)
		retry, _ := strconv.Atoi(r.Header.Get(tasks.HeaderRetryCount))
		tg.mu.Lock()
		tg.pushes = append(tg.pushes, r.Header.Clone())
		tg.bodies[name] = append(tg.bodies[name], body.String())
		tg.mu.Unlock()
		status := http.StatusOK
		if tg.answer != nil {
			status = tg.answer(name, retry)
		}
		if status == 0 {
			<-r.Context().Done() // the queue's dispatch deadline ends it
			return
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *target) count(name string) int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return len(tg.bodies[name])
}

type bundle struct {
	db     *testdb.DB
	queue  *fake.Queue
	client *tasks.Client
}

func setup(t *testing.T, cfg fake.Config) *bundle {
	t.Helper()
	db := testdb.New(t)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 10*time.Millisecond)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 50*time.Millisecond)
	q, err := fake.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(q.Handler())
	t.Cleanup(srv.Close)
	c := tasks.NewClient(srv.URL, 5*time.Second)
	t.Cleanup(c.CloseIdleConnections)
	return &bundle{db: db, queue: q, client: c}
}

func (b *bundle) create(t *testing.T, id, url string) (tasks.Task, error) {
	t.Helper()
	name := ""
	if id != "" {
		name = queuePath + "/tasks/" + id
	}
	return b.client.Create(context.Background(), queuePath, tasks.Task{Name: name,
		HTTPRequest: tasks.HTTPRequest{URL: url, Headers: map[string]string{"Content-Type": "application/json"},
			Body: []byte(`{"id":"` + id + `"}`)}})
}

// drain runs dispatch passes until nothing is due and nothing pending is
// left, or fails after within.
func (b *bundle) drain(t *testing.T, q *fake.Queue, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := q.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		var pending int
		b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fake_tasks.tasks WHERE state = 'PENDING'`).Scan(&pending)
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s %d tasks still pending", within, pending)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A task is pushed to its URL with its body and headers, and Cloud Tasks'
// own; answered 200 it is SUCCEEDED with one attempt.
func TestCreatePushesOnceWithCloudTasksHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{})
	tg := newTarget(t, nil)
	created, err := b.create(t, "evt-1", tg.srv.URL+"/push")
	if err != nil {
		t.Fatal(err)
	}
	if created.Name != queuePath+"/tasks/evt-1" || created.State != tasks.StatePending {
		t.Errorf("created %q in state %s", created.Name, created.State)
	}
	b.drain(t, b.queue, 5*time.Second)
	if tg.count("evt-1") != 1 || tg.bodies["evt-1"][0] != `{"id":"evt-1"}` {
		t.Fatalf("pushes = %v, want one with the task's body", tg.bodies)
	}
	h := tg.pushes[0]
	for k, want := range map[string]string{tasks.HeaderQueueName: "test", tasks.HeaderTaskName: "evt-1",
		tasks.HeaderRetryCount: "0", tasks.HeaderExecutionCount: "0", "Content-Type": "application/json"} {
		if h.Get(k) != want {
			t.Errorf("header %s = %q, want %q", k, h.Get(k), want)
		}
	}
	got, err := b.client.Get(context.Background(), created.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != tasks.StateSucceeded || got.DispatchCount != 1 || got.ResponseCount != 1 || len(got.Attempts) != 1 ||
		got.LastAttempt == nil || got.LastAttempt.ResponseStatus.Code != 200 {
		t.Errorf("after the push: %+v", got)
	}
}

// A non-2xx answer and a push past its dispatch deadline are both retried,
// with the retry count and the previous response in the headers, until a
// push is answered 2xx.
func TestRetriesOnErrorAndPastTheDispatchDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{})
	tg := newTarget(t, func(_ string, retry int) int {
		switch retry {
		case 0:
			return http.StatusServiceUnavailable
		case 1:
			return 0 // never answered: the dispatch deadline passes
		}
		return http.StatusNoContent
	})
	ctx := context.Background()
	created, err := b.client.Create(ctx, queuePath, tasks.Task{Name: queuePath + "/tasks/slow",
		HTTPRequest: tasks.HTTPRequest{URL: tg.srv.URL}, DispatchDeadline: tasks.Duration(200 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	b.drain(t, b.queue, 10*time.Second)
	got, err := b.client.Get(ctx, created.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != tasks.StateSucceeded || got.DispatchCount != 3 || got.ResponseCount != 2 || len(got.Attempts) != 3 {
		t.Fatalf("task = %s, %d pushes, %d answered, %d attempts; want SUCCEEDED, 3, 2, 3", got.State,
			got.DispatchCount, got.ResponseCount, len(got.Attempts))
	}
	if a := got.Attempts[1]; a.Status.Code != 0 || a.Status.Message == "" {
		t.Errorf("the held push is recorded as %+v, want no status and why", a.Status)
	}
	for i, want := range []struct{ retry, prev string }{{"0", ""}, {"1", "503"}, {"2", "0"}} {
		if h := tg.pushes[i]; h.Get(tasks.HeaderRetryCount) != want.retry || h.Get(tasks.HeaderPreviousResponse) != want.prev {
			t.Errorf("push %d: retry %q previous %q; want %q %q", i, h.Get(tasks.HeaderRetryCount),
				h.Get(tasks.HeaderPreviousResponse), want.retry, want.prev)
		}
	}
}

// After MaxAttempts failed pushes the task is FAILED and no more pushed.
func TestMaxAttemptsDropsTheTask(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{MaxAttempts: 3})
	tg := newTarget(t, func(string, int) int { return http.StatusInternalServerError })
	created, err := b.create(t, "doomed", tg.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b.drain(t, b.queue, 10*time.Second)
	got, _ := b.client.Get(context.Background(), created.Name)
	if got.State != tasks.StateFailed || tg.count("doomed") != 3 {
		t.Errorf("task %s after %d pushes; want FAILED after 3", got.State, tg.count("doomed"))
	}
}

// A name is refused while its task is pending and for the window after it
// ran; after the window it creates a new task, pushed again.
func TestNameDedupeWindow(t *testing.T) {
	t.Parallel()
	const window = 400 * time.Millisecond
	b := setup(t, fake.Config{DedupeWindow: window})
	tg := newTarget(t, nil)
	first, err := b.create(t, "evt", tg.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.create(t, "evt", tg.srv.URL); !errors.Is(err, tasks.ErrAlreadyExists) {
		t.Fatalf("second create while pending = %v, want ErrAlreadyExists", err)
	}
	b.drain(t, b.queue, 5*time.Second)
	if _, err := b.create(t, "evt", tg.srv.URL); !errors.Is(err, tasks.ErrAlreadyExists) {
		t.Fatalf("create inside the window after it ran = %v, want ErrAlreadyExists", err)
	}
	time.Sleep(window + 100*time.Millisecond)
	second, err := b.create(t, "evt", tg.srv.URL)
	if err != nil {
		t.Fatalf("create after the window = %v, want a new task", err)
	}
	b.drain(t, b.queue, 5*time.Second)
	if tg.count("evt") != 2 {
		t.Errorf("%d pushes of the name, want 2: the name reused after the window is a new task", tg.count("evt"))
	}
	var rows int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fake_tasks.tasks WHERE name = 'evt'`).Scan(&rows)
	if rows != 2 || first.Name != second.Name {
		t.Errorf("%d task rows for the name (%s, %s), want 2 of one name", rows, first.Name, second.Name)
	}
}

// Many concurrent creates of one name: exactly one task.
func TestConcurrentCreatesOfOneName(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{})
	tg := newTarget(t, nil)
	const n = 16
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = b.create(t, "raced", tg.srv.URL)
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for _, err := range errs {
		switch {
		case err == nil:
			created++
		case !errors.Is(err, tasks.ErrAlreadyExists):
			t.Errorf("create: %v", err)
		}
	}
	if created != 1 {
		t.Errorf("%d of %d concurrent creates made a task, want 1", created, n)
	}
}

// Two queue instances on one database push every task exactly once: the
// claim skips what the other holds.
func TestTwoInstancesPushEachTaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{Instance: "a"})
	other, err := fake.New(b.db.Pool, fake.Config{Instance: "b", Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Both instances must take part, whatever the machine's speed: the
	// target holds every push until more are in flight than instance a can
	// send alone (its 32 slots) — so b has sent one too — or 10 s have
	// passed (then the count below says b never pushed). A loaded machine
	// once let a drain all 60 before b began.
	var inFlight atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-both:
		case <-time.After(10 * time.Second):
			once.Do(func() { close(both) })
		}
	}()
	tg := newTarget(t, func(string, int) int {
		if inFlight.Add(1) > 32 {
			once.Do(func() { close(both) })
		}
		<-both
		time.Sleep(5 * time.Millisecond)
		return 200
	})
	const n = 60
	for i := range n {
		if _, err := b.create(t, fmt.Sprintf("t%d", i), tg.srv.URL); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, q := range []*fake.Queue{b.queue, other} {
		wg.Add(1)
		go func() { defer wg.Done(); q.Run(ctx) }()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pending int
		b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_tasks.tasks WHERE state <> 'SUCCEEDED'`).Scan(&pending)
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d tasks not done", pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	var instances int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT instance) FROM fake_tasks.attempts`).Scan(&instances)
	for i := range n {
		if c := tg.count(fmt.Sprintf("t%d", i)); c != 1 {
			t.Errorf("task t%d pushed %d times, want 1", i, c)
		}
	}
	if instances != 2 {
		t.Errorf("%d instances pushed, want both", instances)
	}
}

// A queue instance that stops mid-push records nothing; once its lease ran
// out another instance pushes the task again (by design: at least once).
func TestLeaseOfAnInstanceThatDiedRunsOut(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{LeaseMargin: 100 * time.Millisecond})
	entered := make(chan struct{}, 4)
	tg := newTarget(t, func(_ string, retry int) int {
		entered <- struct{}{}
		if retry == 0 {
			return 0 // held until the dying instance gives up
		}
		return 200
	})
	ctx := context.Background()
	created, err := b.client.Create(ctx, queuePath, tasks.Task{Name: queuePath + "/tasks/orphan",
		HTTPRequest: tasks.HTTPRequest{URL: tg.srv.URL}, DispatchDeadline: tasks.Duration(300 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	dying, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.queue.RunOnce(dying); close(done) }()
	<-entered
	cancel() // the instance dies mid-push
	<-done
	survivor, err := fake.New(b.db.Pool, fake.Config{Instance: "survivor"})
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := survivor.RunOnce(ctx); c.Claimed != 0 {
		t.Fatalf("the survivor claimed %d inside the dead instance's lease, want 0", c.Claimed)
	}
	time.Sleep(450 * time.Millisecond) // the deadline plus the margin
	b.drain(t, survivor, 5*time.Second)
	got, _ := b.client.Get(ctx, created.Name)
	if got.State != tasks.StateSucceeded || tg.count("orphan") != 2 || len(got.Attempts) != 1 || got.Attempts[0].Instance != "survivor" {
		t.Errorf("task %s, %d pushes, attempts %+v; want SUCCEEDED after the survivor's push", got.State, tg.count("orphan"), got.Attempts)
	}
}

// Bad requests are refused with Cloud Tasks' error shape and change nothing.
func TestBadRequestsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, fake.Config{})
	srv := httptest.NewServer(b.queue.Handler())
	defer srv.Close()
	base := srv.URL + "/v2/" + queuePath + "/tasks"
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"not JSON", `{`, 400},
		{"unknown field", `{"task": {"httpRequest": {"url": "http://x"}}, "extra": 1}`, 400},
		{"no url", `{"task": {}}`, 400},
		{"ftp url", `{"task": {"httpRequest": {"url": "ftp://x/y"}}}`, 400},
		{"bad task id", `{"task": {"name": "` + queuePath + `/tasks/a b", "httpRequest": {"url": "http://x"}}}`, 400},
		{"other queue", `{"task": {"name": "projects/idemlab/locations/local/queues/other/tasks/a", "httpRequest": {"url": "http://x"}}}`, 400},
		{"bad deadline", `{"task": {"httpRequest": {"url": "http://x"}, "dispatchDeadline": "2h"}}`, 400},
		{"deadline not seconds", `{"task": {"httpRequest": {"url": "http://x"}, "dispatchDeadline": 30}}`, 400},
		{"two objects", `{"task": {"httpRequest": {"url": "http://x"}}} {}`, 400},
	} {
		resp, err := http.Post(base, "application/json", bytes.NewBufferString(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
	}
	for path, status := range map[string]int{
		srv.URL + "/v2/projects/idemlab/locations/local/queues/test/tasks/none":    404,
		srv.URL + "/v2/projects/idemlab/locations/local/queues/test/tasks?state=x": 400,
		srv.URL + "/v2/projects/i%20d/locations/local/queues/test/tasks":           400,
	} {
		resp, err := http.Get(path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, status)
		}
	}
	var n int
	b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM fake_tasks.tasks`).Scan(&n)
	if n != 0 {
		t.Errorf("%d tasks after only bad requests", n)
	}
}
