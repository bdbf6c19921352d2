// Package tasks speaks to a task queue in the shape of Google Cloud Tasks:
// a caller creates a named task holding an HTTP request; the queue pushes
// that request to its URL until a push is answered 2xx, retrying with
// backoff, and refuses a second task of the same name for a while (the
// creation dedupe). internal/tasks/fake is the queue, as internal/provider/fake
// is the provider; this package is what both sides share — the task's JSON,
// the push headers — and the client the app creates tasks with.
//
// What the queue promises, and what it leaves to the handler:
//
//   - at least once: a push that fails, times out (dispatch deadline) or
//     whose answer is lost is pushed again, with the same task name and a
//     higher retry count. The handler must turn repeats into one outcome —
//     never dedupe on the retry count, which says nothing about whether an
//     earlier push committed.
//   - creation dedupe by name: while a task is pending, and for the queue's
//     window after it ran (about an hour on Cloud Tasks), creating a task of
//     the same name is refused (409 ALREADY_EXISTS). After the window the
//     same name makes a new task, pushed again in full.
package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"
)

// The headers a push carries, as Cloud Tasks names them.
const (
	HeaderQueueName = "X-CloudTasks-QueueName" // the queue's id
	HeaderTaskName  = "X-CloudTasks-TaskName"  // the task's id (the short name)
	// HeaderRetryCount: how many times this task was pushed before (0 on
	// the first push). Informational: a retry may follow a push that
	// committed.
	HeaderRetryCount = "X-CloudTasks-TaskRetryCount"
	// HeaderExecutionCount: how many earlier pushes got an HTTP answer.
	HeaderExecutionCount = "X-CloudTasks-TaskExecutionCount"
	// HeaderETA: when the push was scheduled, seconds since the epoch.
	HeaderETA = "X-CloudTasks-TaskETA"
	// HeaderPreviousResponse: the HTTP status the previous push got ("0"
	// when none came back).
	HeaderPreviousResponse = "X-CloudTasks-TaskPreviousResponse"
)

// Task is a task as the queue's API shows it (Cloud Tasks' Task resource,
// with its state and attempts added: the fake keeps a finished task to show
// it, where Cloud Tasks deletes it).
type Task struct {
	// Name is the full resource name,
	// projects/{p}/locations/{l}/queues/{q}/tasks/{id}.
	Name             string       `json:"name"`
	HTTPRequest      HTTPRequest  `json:"httpRequest"`
	ScheduleTime     time.Time    `json:"scheduleTime"`
	CreateTime       time.Time    `json:"createTime"`
	DispatchDeadline Duration     `json:"dispatchDeadline"`
	DispatchCount    int          `json:"dispatchCount"`
	ResponseCount    int          `json:"responseCount"`
	LastAttempt      *Attempt     `json:"lastAttempt,omitempty"`
	State            string       `json:"state,omitempty"` // PENDING, SUCCEEDED or FAILED
	Attempts         []AttemptLog `json:"attempts,omitempty"`
}

// Task states (the fake's addition).
const (
	StatePending   = "PENDING"
	StateSucceeded = "SUCCEEDED"
	StateFailed    = "FAILED"
)

// HTTPRequest is what the queue pushes.
type HTTPRequest struct {
	URL        string            `json:"url"`
	HTTPMethod string            `json:"httpMethod,omitempty"` // default POST
	Headers    map[string]string `json:"headers,omitempty"`
	Body       []byte            `json:"body,omitempty"` // base64 in JSON, as Cloud Tasks has it
}

// Attempt is the outcome of a task's last push.
type Attempt struct {
	DispatchTime   time.Time `json:"dispatchTime"`
	ResponseTime   time.Time `json:"responseTime"`
	ResponseStatus Status    `json:"responseStatus"`
}

// Status is a push's outcome: Code is the HTTP status, 0 when no answer
// came (the dispatch deadline passed, the connection failed).
type Status struct {
	Code    int    `json:"code"`
	Message string `json:"message,omitempty"`
}

// AttemptLog is one push of a task.
type AttemptLog struct {
	Retry        int       `json:"retry"`
	Instance     string    `json:"instance"`
	DispatchTime time.Time `json:"dispatchTime"`
	ResponseTime time.Time `json:"responseTime"`
	Status       Status    `json:"status"`
}

// Duration marshals as Cloud Tasks writes durations: "30s", "0.5s".
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(fmt.Sprintf("%gs", time.Duration(d).Seconds()))
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`a duration is a string like "30s"`)
	}
	if !strings.HasSuffix(s, "s") {
		return fmt.Errorf(`duration %q is not in seconds like "30s"`, s)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf(`duration %q is not in seconds like "30s"`, s)
	}
	*d = Duration(v)
	return nil
}

// ErrorBody is the JSON of every error the queue answers (Google's shape):
// {"error": {"code": 409, "message": "…", "status": "ALREADY_EXISTS"}}.
type ErrorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
	} `json:"error"`
}

var (
	// ErrAlreadyExists: a task of this name is pending, or ran inside the
	// queue's dedupe window. Nothing was created.
	ErrAlreadyExists = errors.New("tasks: a task of this name exists or ran recently")
	// ErrNotFound: no task of this name.
	ErrNotFound = errors.New("tasks: no such task")
	// ErrInvalid: the queue refused the request as malformed.
	ErrInvalid = errors.New("tasks: invalid request")
	// ErrUnavailable: the queue could not be reached or failed; the task
	// may or may not exist (create it again with the same name to know).
	ErrUnavailable = errors.New("tasks: queue unavailable")
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,500}$`)

// ValidID reports whether s is a queue, project, location or task id Cloud
// Tasks would take: letters, digits, hyphens and underscores.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// QueuePath is a queue's resource name.
func QueuePath(project, location, queue string) string {
	return "projects/" + project + "/locations/" + location + "/queues/" + queue
}

// Client creates and reads tasks over the queue's HTTP API. It is safe for
// concurrent use.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client for the queue at baseURL, each call bounded
// by timeout.
func NewClient(baseURL string, timeout time.Duration) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), http: &http.Client{Timeout: timeout}}
}

// CloseIdleConnections closes idle keep-alive connections.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Create creates t in the queue at queuePath (t.Name is the full name the
// task is to have, or empty for one the queue makes up). Errors:
// ErrAlreadyExists (the name is taken: pending, or ran inside the window),
// ErrInvalid, ErrUnavailable.
func (c *Client) Create(ctx context.Context, queuePath string, t Task) (Task, error) {
	body, err := json.Marshal(struct {
		Task Task `json:"task"`
	}{t})
	if err != nil {
		return Task{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var out Task
	return out, c.do(ctx, http.MethodPost, "/v2/"+queuePath+"/tasks", body, &out)
}

// Ping asks the queue at queuePath for one task: nil when the queue
// answers (whatever it holds), ErrUnavailable when it does not.
func (c *Client) Ping(ctx context.Context, queuePath string) error {
	var out struct {
		Tasks []Task `json:"tasks"`
	}
	return c.do(ctx, http.MethodGet, "/v2/"+queuePath+"/tasks?pageSize=1", nil, &out)
}

// Get returns the task named name (its full resource name).
func (c *Client) Get(ctx context.Context, name string) (Task, error) {
	var out Task
	return out, c.do(ctx, http.MethodGet, "/v2/"+name, nil, &out)
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%w: answer: %v", ErrUnavailable, err)
		}
		return nil
	}
	var e ErrorBody
	json.Unmarshal(raw, &e)
	switch {
	case resp.StatusCode == http.StatusConflict:
		return fmt.Errorf("%w: %s", ErrAlreadyExists, e.Error.Message)
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s", ErrNotFound, e.Error.Message)
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return fmt.Errorf("%w: %d %s: %s", ErrInvalid, resp.StatusCode, e.Error.Status, e.Error.Message)
	default:
		return fmt.Errorf("%w: %d %s", ErrUnavailable, resp.StatusCode, e.Error.Message)
	}
}
