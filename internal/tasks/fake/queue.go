package fake

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/tasks"
)

// Config tunes a Queue. Zero fields take the defaults.
type Config struct {
	// Instance names this queue process in the attempts log.
	Instance string
	// DedupeWindow is how long after a task finished its name still refuses
	// a new task (Cloud Tasks: about an hour). Default 1h.
	DedupeWindow time.Duration
	// MaxAttempts pushes, then a task is FAILED and dropped (Cloud Tasks'
	// maxAttempts, default 100).
	MaxAttempts int
	// MinBackoff is the wait after the first failed push, doubling, at most
	// MaxBackoff. Defaults 100ms (Cloud Tasks' own) and 10s.
	MinBackoff, MaxBackoff time.Duration
	// DispatchDeadline is a task's deadline when its creator gave none: a
	// push not answered within it counts as failed. Default 30s.
	DispatchDeadline time.Duration
	// LeaseMargin is how long past a push's dispatch deadline its claim
	// keeps other queue instances off the task: a queue instance that dies
	// mid-push has the task pushed again by another once it passes. Default 2s.
	LeaseMargin time.Duration
	// Interval between polls for due tasks. Default 200ms.
	Interval time.Duration
	// Concurrency bounds the pushes in flight in this instance. Default 32.
	Concurrency int
	// Retention is how long finished tasks are kept, at least DedupeWindow
	// (a purged task frees its name). Default 24h.
	Retention time.Duration
	// Client sends the pushes; each is bounded by its dispatch deadline.
	Client *http.Client
	Logger *slog.Logger
	// Control says who may use POST /v2/reset (loopback by default).
	Control fault.Access
}

func (c Config) withDefaults() Config {
	c.Instance = cmp.Or(c.Instance, "queue")
	c.DedupeWindow = cmp.Or(c.DedupeWindow, time.Hour)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 100)
	c.MinBackoff = cmp.Or(c.MinBackoff, 100*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 10*time.Second)
	c.DispatchDeadline = cmp.Or(c.DispatchDeadline, 30*time.Second)
	c.LeaseMargin = cmp.Or(c.LeaseMargin, 2*time.Second)
	c.Interval = cmp.Or(c.Interval, 200*time.Millisecond)
	c.Concurrency = cmp.Or(c.Concurrency, 32)
	c.Retention = max(cmp.Or(c.Retention, 24*time.Hour), c.DedupeWindow)
	if c.Client == nil {
		c.Client = &http.Client{} // no timeout of its own: each push has its deadline
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.DedupeWindow < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.DispatchDeadline < 0 ||
		c.LeaseMargin < 0 || c.Interval < 0 || c.Retention < 0:
		return errors.New("fake tasks: durations must not be negative")
	case c.MaxAttempts < 0 || c.Concurrency < 0:
		return errors.New("fake tasks: counts must not be negative")
	case c.DispatchDeadline > maxDispatchDeadline:
		return fmt.Errorf("fake tasks: dispatch deadline %s is over %s", c.DispatchDeadline, maxDispatchDeadline)
	}
	return nil
}

// maxDispatchDeadline is Cloud Tasks' bound on a push.
const maxDispatchDeadline = 30 * time.Minute

// Queue is the fake task queue: tasks kept in the fake_tasks schema, pushed
// by every Queue on the database (Run), created and read through Handler.
type Queue struct {
	pool *pgxpool.Pool
	cfg  Config
	wake chan struct{}
	// slots bounds the pushes in flight; pushes waits for them.
	slots  chan struct{}
	pushes sync.WaitGroup
}

// New returns a Queue keeping its state in pool's database, which must be
// migrated (migrations/00080_fake_tasks.sql). Give it a pool of its own: an
// external system shares nothing with the app but the database server.
func New(pool *pgxpool.Pool, cfg Config) (*Queue, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Queue{pool: pool, cfg: cfg, wake: make(chan struct{}, 1), slots: make(chan struct{}, cfg.Concurrency)}, nil
}

// queueRef is a queue's resource name, parsed.
type queueRef struct{ project, location, queue string }

func (r queueRef) path() string { return tasks.QueuePath(r.project, r.location, r.queue) }

// parseQueue reads projects/{p}/locations/{l}/queues/{q}.
func parseQueue(path string) (queueRef, error) {
	p := strings.Split(path, "/")
	if len(p) != 6 || p[0] != "projects" || p[2] != "locations" || p[4] != "queues" ||
		!tasks.ValidID(p[1]) || !tasks.ValidID(p[3]) || !tasks.ValidID(p[5]) || len(p[5]) > 100 {
		return queueRef{}, fmt.Errorf("%w: %q is not projects/{project}/locations/{location}/queues/{queue}", tasks.ErrInvalid, path)
	}
	return queueRef{p[1], p[3], p[5]}, nil
}

// parseTask reads …/queues/{q}/tasks/{id}.
func parseTask(name string) (queueRef, string, error) {
	i := strings.LastIndex(name, "/tasks/")
	if i < 0 {
		return queueRef{}, "", fmt.Errorf("%w: %q is not a task name (…/queues/{queue}/tasks/{id})", tasks.ErrInvalid, name)
	}
	ref, err := parseQueue(name[:i])
	if err != nil {
		return queueRef{}, "", err
	}
	id := name[i+len("/tasks/"):]
	if !tasks.ValidID(id) {
		return queueRef{}, "", fmt.Errorf("%w: task id %q must be 1 to 500 letters, digits, hyphens or underscores", tasks.ErrInvalid, id)
	}
	return ref, id, nil
}

const sqlInsertTask = `
INSERT INTO fake_tasks.tasks (id, queue, name, url, http_method, headers, body, dispatch_deadline_ms, schedule_time)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, coalesce($9, now()))
RETURNING created_at, schedule_time`

const sqlTakeName = `
INSERT INTO fake_tasks.names AS n (queue, name, task_id)
VALUES ($1, $2, $3)
    ON CONFLICT (queue, name) DO UPDATE
   SET task_id = excluded.task_id,
       finished_at = NULL
 WHERE n.finished_at < now() - make_interval(secs => $4) -- 0 rows: the holder is pending, or finished inside the window
RETURNING task_id`

// Create adds t to the queue at queuePath and returns it as stored. The
// name is t.Name's id, or a random one when t.Name is empty. Errors:
// tasks.ErrAlreadyExists when the name is taken — its task is pending, or
// finished less than DedupeWindow ago — and tasks.ErrInvalid. Two
// concurrent creates of one name: one gets it, the other waits for its
// commit and is refused.
func (q *Queue) Create(ctx context.Context, queuePath string, t tasks.Task) (tasks.Task, error) {
	ref, err := parseQueue(queuePath)
	if err != nil {
		return tasks.Task{}, err
	}
	id := randomID()
	if t.Name != "" {
		var named queueRef
		if named, id, err = parseTask(t.Name); err != nil {
			return tasks.Task{}, err
		}
		if named != ref {
			return tasks.Task{}, fmt.Errorf("%w: task %q is not in queue %q", tasks.ErrInvalid, t.Name, queuePath)
		}
	}
	req := t.HTTPRequest
	if u, err := url.Parse(req.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return tasks.Task{}, fmt.Errorf("%w: httpRequest.url %q is not an http(s) URL", tasks.ErrInvalid, req.URL)
	}
	req.HTTPMethod = cmp.Or(req.HTTPMethod, http.MethodPost)
	switch req.HTTPMethod {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodGet, http.MethodDelete:
	default:
		return tasks.Task{}, fmt.Errorf("%w: httpRequest.httpMethod %q", tasks.ErrInvalid, req.HTTPMethod)
	}
	if req.Headers == nil {
		req.Headers = map[string]string{}
	}
	if req.Body == nil {
		req.Body = []byte{}
	}
	deadline := cmp.Or(time.Duration(t.DispatchDeadline), q.cfg.DispatchDeadline)
	if deadline < time.Millisecond || deadline > maxDispatchDeadline {
		return tasks.Task{}, fmt.Errorf("%w: dispatchDeadline %s is not from 1ms to 30m", tasks.ErrInvalid, deadline)
	}
	var schedule *time.Time
	if !t.ScheduleTime.IsZero() {
		schedule = &t.ScheduleTime
	}
	taskID := uuid.New()
	out := tasks.Task{Name: ref.path() + "/tasks/" + id, HTTPRequest: req, DispatchDeadline: tasks.Duration(deadline),
		State: tasks.StatePending}
	err = pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sqlInsertTask, taskID, ref.path(), id, req.URL, req.HTTPMethod, req.Headers, req.Body,
			deadline.Milliseconds(), schedule).Scan(&out.CreateTime, &out.ScheduleTime)
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, sqlTakeName, ref.path(), id, taskID, q.cfg.DedupeWindow.Seconds()).Scan(&taskID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", tasks.ErrAlreadyExists, out.Name)
		}
		return err
	})
	if err != nil {
		if errors.Is(err, tasks.ErrAlreadyExists) {
			return tasks.Task{}, err
		}
		return tasks.Task{}, fmt.Errorf("fake tasks: create %s: %w", out.Name, err)
	}
	select { // a dispatcher in this process pushes it at once
	case q.wake <- struct{}{}:
	default:
	}
	return out, nil
}

func randomID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

const sqlTaskColumns = `
SELECT t.id, t.queue, t.name, t.url, t.http_method, t.headers, t.body, t.dispatch_deadline_ms, t.state,
       t.schedule_time, t.created_at, t.dispatch_count, t.response_count, t.last_status, t.last_error,
       a.dispatched_at, a.answered_at
  FROM fake_tasks.tasks t
  LEFT JOIN LATERAL (SELECT dispatched_at, answered_at
                       FROM fake_tasks.attempts
                      WHERE task_id = t.id
                      ORDER BY id DESC
                      LIMIT 1) a ON true`

func scanTask(row pgx.Row) (uuid.UUID, tasks.Task, error) {
	var (
		id                  uuid.UUID
		queue, name         string
		t                   tasks.Task
		deadlineMS          int64
		lastStatus          *int
		lastError           *string
		dispatched, replied *time.Time
	)
	err := row.Scan(&id, &queue, &name, &t.HTTPRequest.URL, &t.HTTPRequest.HTTPMethod, &t.HTTPRequest.Headers,
		&t.HTTPRequest.Body, &deadlineMS, &t.State, &t.ScheduleTime, &t.CreateTime, &t.DispatchCount,
		&t.ResponseCount, &lastStatus, &lastError, &dispatched, &replied)
	if err != nil {
		return id, t, err
	}
	t.Name = queue + "/tasks/" + name
	t.DispatchDeadline = tasks.Duration(time.Duration(deadlineMS) * time.Millisecond)
	if dispatched != nil {
		t.LastAttempt = &tasks.Attempt{DispatchTime: *dispatched, ResponseTime: *replied,
			ResponseStatus: tasks.Status{Code: database.Deref(lastStatus), Message: database.Deref(lastError)}}
	}
	return id, t, nil
}

// Get returns the newest task of the name (a name reused after the window
// names a new task) with every push it had. Errors: tasks.ErrNotFound,
// tasks.ErrInvalid.
func (q *Queue) Get(ctx context.Context, name string) (tasks.Task, error) {
	ref, id, err := parseTask(name)
	if err != nil {
		return tasks.Task{}, err
	}
	taskID, t, err := scanTask(q.pool.QueryRow(ctx, sqlTaskColumns+`
		 WHERE t.queue = $1
		   AND t.name = $2
		 ORDER BY t.created_at DESC
		 LIMIT 1`, ref.path(), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return tasks.Task{}, fmt.Errorf("%w: %s", tasks.ErrNotFound, name)
	}
	if err != nil {
		return tasks.Task{}, fmt.Errorf("fake tasks: get %s: %w", name, err)
	}
	rows, err := q.pool.Query(ctx, `
		SELECT retry, instance, dispatched_at, answered_at, coalesce(status, 0), coalesce(error, '')
		  FROM fake_tasks.attempts
		 WHERE task_id = $1
		 ORDER BY id`, taskID)
	if err != nil {
		return tasks.Task{}, fmt.Errorf("fake tasks: get %s: %w", name, err)
	}
	var a tasks.AttemptLog
	_, err = pgx.ForEachRow(rows, []any{&a.Retry, &a.Instance, &a.DispatchTime, &a.ResponseTime, &a.Status.Code, &a.Status.Message},
		func() error { t.Attempts = append(t.Attempts, a); return nil })
	if err != nil {
		return tasks.Task{}, fmt.Errorf("fake tasks: get %s: %w", name, err)
	}
	return t, nil
}

// List returns the queue's newest tasks (state "" for any), at most limit.
func (q *Queue) List(ctx context.Context, queuePath, state string, limit int) ([]tasks.Task, error) {
	ref, err := parseQueue(queuePath)
	if err != nil {
		return nil, err
	}
	rows, err := q.pool.Query(ctx, sqlTaskColumns+`
		 WHERE t.queue = $1
		   AND (t.state = $2 OR $2 = '')
		 ORDER BY t.created_at DESC
		 LIMIT $3`, ref.path(), state, limit)
	if err != nil {
		return nil, fmt.Errorf("fake tasks: list: %w", err)
	}
	defer rows.Close()
	list := []tasks.Task{}
	for rows.Next() {
		_, t, err := scanTask(rows)
		if err != nil {
			return nil, fmt.Errorf("fake tasks: list: %w", err)
		}
		list = append(list, t)
	}
	return list, rows.Err()
}

// Reset forgets every task and name.
func (q *Queue) Reset(ctx context.Context) error {
	if _, err := q.pool.Exec(ctx, `DELETE FROM fake_tasks.tasks`); err != nil { // names and attempts cascade
		return fmt.Errorf("fake tasks: reset: %w", err)
	}
	return nil
}

// Counts is what one dispatch pass did.
type Counts struct {
	Claimed, Succeeded, Retried, Failed, Fenced int
}

// Run pushes due tasks until ctx is done: a pass at every tick, when a task
// is created here, and when a push finishes. Pushes in flight are
// abandoned at the end (their leases run out; another instance, or this
// one restarted, pushes them again) and waited for.
func (q *Queue) Run(ctx context.Context) {
	ticker := time.NewTicker(q.cfg.Interval)
	defer ticker.Stop()
	lastPurge := time.Now()
	for {
		if _, err := q.dispatch(ctx, nil); err != nil && ctx.Err() == nil {
			q.cfg.Logger.Error("fake tasks: dispatch failed", "err", err)
		}
		if time.Since(lastPurge) > time.Minute {
			lastPurge = time.Now()
			if _, err := q.purge(ctx); err != nil && ctx.Err() == nil {
				q.cfg.Logger.Error("fake tasks: purge failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			q.pushes.Wait()
			return
		case <-ticker.C:
		case <-q.wake:
		}
	}
}

// runOnce claims every due task, pushes them and waits for the pushes.
func (q *Queue) runOnce(ctx context.Context) (Counts, error) {
	var total Counts
	var mu sync.Mutex
	n, err := q.dispatch(ctx, func(c Counts) {
		mu.Lock()
		defer mu.Unlock()
		total.Succeeded += c.Succeeded
		total.Retried += c.Retried
		total.Failed += c.Failed
		total.Fenced += c.Fenced
	})
	q.pushes.Wait()
	total.Claimed = n
	return total, err
}

const sqlClaim = `
UPDATE fake_tasks.tasks t
   SET schedule_time = now() + make_interval(secs => t.dispatch_deadline_ms / 1000.0 + $3), -- the lease: other instances skip it meanwhile
       lease_token = $2,
       dispatch_count = t.dispatch_count + 1
  FROM (SELECT id, schedule_time
          FROM fake_tasks.tasks
         WHERE state = 'PENDING'
           AND schedule_time <= now()
         ORDER BY schedule_time
         LIMIT $1
           FOR UPDATE SKIP LOCKED -- tasks another instance is claiming right now are skipped, not waited for
       ) due
 WHERE t.id = due.id
RETURNING t.id, t.queue, t.name, t.url, t.http_method, t.headers, t.body, t.dispatch_deadline_ms,
          t.dispatch_count, t.response_count, coalesce(t.last_status, 0), due.schedule_time`

// claimed is one task this instance is to push.
type claimed struct {
	id                       uuid.UUID
	queue, name, url, method string
	headers                  map[string]string
	body                     []byte
	deadlineMS               int64
	dispatchCount, responses int
	lastStatus               int
	eta                      time.Time
}

// dispatch claims due tasks, as many as there are free push slots, batch
// after batch, and starts a push for each. done, if set, hears each push's
// result. It returns how many it claimed.
func (q *Queue) dispatch(ctx context.Context, done func(Counts)) (int, error) {
	total := 0
	for ctx.Err() == nil {
		free := cap(q.slots) - len(q.slots)
		if free == 0 {
			return total, nil
		}
		token := uuid.New()
		rows, err := q.pool.Query(ctx, sqlClaim, free, token, q.cfg.LeaseMargin.Seconds())
		if err != nil {
			return total, fmt.Errorf("fake tasks: claim: %w", err)
		}
		var batch []claimed
		var c claimed
		_, err = pgx.ForEachRow(rows, []any{&c.id, &c.queue, &c.name, &c.url, &c.method, &c.headers, &c.body,
			&c.deadlineMS, &c.dispatchCount, &c.responses, &c.lastStatus, &c.eta}, func() error {
			batch = append(batch, c)
			c.headers = nil
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("fake tasks: claim: %w", err)
		}
		total += len(batch)
		for _, c := range batch {
			q.slots <- struct{}{}
			q.pushes.Add(1)
			go func() {
				defer q.pushes.Done()
				counts := q.pushAndRecord(ctx, c, token)
				<-q.slots
				if done != nil {
					done(counts)
				}
				select { // a slot is free: look for more
				case q.wake <- struct{}{}:
				default:
				}
			}()
		}
		if len(batch) < free {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// pushResult is what one push got back.
type pushResult struct {
	answered bool
	status   int
	err      string
}

func (r pushResult) ok() bool { return r.answered && r.status >= 200 && r.status < 300 }

// push sends c's request once, bounded by its dispatch deadline, with the
// headers Cloud Tasks adds.
func (q *Queue) push(ctx context.Context, c claimed) pushResult {
	deadline := time.Duration(c.deadlineMS) * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, c.method, c.url, bytes.NewReader(c.body))
	if err != nil {
		return pushResult{err: err.Error()}
	}
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	ref, _ := parseQueue(c.queue)
	req.Header.Set("User-Agent", "Google-Cloud-Tasks")
	req.Header.Set(tasks.HeaderQueueName, ref.queue)
	req.Header.Set(tasks.HeaderTaskName, c.name)
	req.Header.Set(tasks.HeaderRetryCount, strconv.Itoa(c.dispatchCount-1))
	req.Header.Set(tasks.HeaderExecutionCount, strconv.Itoa(c.responses))
	req.Header.Set(tasks.HeaderETA, fmt.Sprintf("%.6f", float64(c.eta.UnixMicro())/1e6))
	if c.dispatchCount > 1 {
		req.Header.Set(tasks.HeaderPreviousResponse, strconv.Itoa(c.lastStatus))
	}
	resp, err := q.cfg.Client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return pushResult{err: fmt.Sprintf("no answer within the dispatch deadline (%s)", deadline)}
		}
		return pushResult{err: err.Error()}
	}
	defer resp.Body.Close()
	// The answer counts once it is read in full, inside the deadline.
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return pushResult{err: "answer cut off: " + err.Error()}
	}
	return pushResult{answered: true, status: resp.StatusCode}
}

const sqlSucceeded = `
UPDATE fake_tasks.tasks
   SET state = 'SUCCEEDED',
       finished_at = now(),
       lease_token = NULL,
       response_count = response_count + 1,
       last_status = $3,
       last_error = NULL
 WHERE id = $1
   AND lease_token = $2 -- the fence: 0 rows when our lease ran out and another instance took the task
RETURNING state`

const sqlRetry = `
UPDATE fake_tasks.tasks
   SET lease_token = NULL,
       response_count = response_count + $3,
       last_status = $4,
       last_error = $5,
       -- attempts ran out: the task is dropped (Cloud Tasks deletes it)
       state = CASE WHEN dispatch_count >= $6 THEN 'FAILED' ELSE 'PENDING' END,
       finished_at = CASE WHEN dispatch_count >= $6 THEN now() END,
       schedule_time = now() + make_interval(secs => least($7 * 2 ^ least(dispatch_count - 1, 30), $8))
 WHERE id = $1
   AND lease_token = $2 -- the fence
RETURNING state`

const sqlNameFinished = `
UPDATE fake_tasks.names
   SET finished_at = now() -- the dedupe window starts
 WHERE task_id = $1`

const sqlLogAttempt = `
INSERT INTO fake_tasks.attempts (task_id, retry, instance, dispatched_at, status, error)
VALUES ($1, $2, $3, $4, $5, $6)`

// pushAndRecord pushes c and records the outcome, fenced by the claim's
// token: 2xx → SUCCEEDED; anything else → PENDING after the backoff, or
// FAILED when the attempts ran out. A push cut short because this
// instance is stopping records nothing: the lease runs out and the task is
// pushed again — as after a crash.
func (q *Queue) pushAndRecord(ctx context.Context, c claimed, token uuid.UUID) Counts {
	var counts Counts
	dispatched := time.Now()
	res := q.push(ctx, c)
	if ctx.Err() != nil {
		return counts
	}
	var status *int
	if res.answered {
		status = &res.status
	}
	var errText *string
	if res.err != "" {
		errText = &res.err
	}
	err := pgx.BeginFunc(ctx, q.pool, func(tx pgx.Tx) error {
		var state string
		var err error
		if res.ok() {
			err = tx.QueryRow(ctx, sqlSucceeded, c.id, token, res.status).Scan(&state)
		} else {
			answered := 0
			if res.answered {
				answered = 1
			}
			err = tx.QueryRow(ctx, sqlRetry, c.id, token, answered, status, errText, q.cfg.MaxAttempts,
				q.cfg.MinBackoff.Seconds(), q.cfg.MaxBackoff.Seconds()).Scan(&state)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			counts.Fenced++
			return nil // another instance has the task now; its push counts
		}
		if err != nil {
			return err
		}
		switch state {
		case tasks.StateSucceeded:
			counts.Succeeded++
		case tasks.StateFailed:
			counts.Failed++
		default:
			counts.Retried++
		}
		if state != tasks.StatePending {
			if _, err := tx.Exec(ctx, sqlNameFinished, c.id); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, sqlLogAttempt, c.id, c.dispatchCount-1, q.cfg.Instance, dispatched, status, errText)
		return err
	})
	if err != nil {
		q.cfg.Logger.Error("fake tasks: record a push", "task", c.name, "err", err)
	}
	if counts.Failed > 0 {
		q.cfg.Logger.Warn("fake tasks: task dropped after its last attempt", "queue", c.queue, "task", c.name,
			"attempts", c.dispatchCount)
	}
	return counts
}

// purge deletes tasks finished more than Retention ago (never inside the
// dedupe window: Retention is at least DedupeWindow).
func (q *Queue) purge(ctx context.Context) (int64, error) {
	tag, err := q.pool.Exec(ctx, `
		DELETE FROM fake_tasks.tasks
		 WHERE id IN (SELECT id
		                FROM fake_tasks.tasks
		               WHERE state <> 'PENDING'
		                 AND finished_at < now() - make_interval(secs => $1)
		               LIMIT 1000)`, q.cfg.Retention.Seconds())
	if err != nil {
		return 0, fmt.Errorf("fake tasks: purge: %w", err)
	}
	return tag.RowsAffected(), nil
}
