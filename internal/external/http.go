package external

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/idemlab/idemlab/internal/tracing"
)

// maxBody bounds how much of an answer the client reads. Answers are a few
// bytes of JSON; anything bigger is not the system we know.
const maxBody = 64 << 10

// Client sends keyed calls to one system's HTTP API and classifies the
// answers. Each system's client (provider.HTTPClient, payments.HTTPClient) is
// a thin layer over it naming the paths and bodies. It is safe for
// concurrent use and owns its Transport, so CloseIdleConnections affects
// only connections to that system.
//
// The contract every system's API keeps, and Send and Status read:
//
//	POST {path}        Idempotency-Key, Request-Deadline, a JSON body
//	    200 {"status":"COMPLETED"}           → Confirmed
//	    422 {"status":"REJECTED","reason"}   → Rejected
//	    202 {"status":"RUNNING"}             → Unknown, Truth RUNNING
//	    anything else, or no answer          → Unknown, Err says why
//	GET  {path}/{key}
//	    200 {"status": RUNNING|COMPLETED|REJECTED}
//	    404 {"status":"NOT_STARTED"}
type Client struct {
	system  string // names the system in errors: "provider: …"
	baseURL string
	timeout time.Duration
	http    *http.Client
	conns   *http.Transport // under the tracing wrapper, which cannot close idle connections
}

// NewClient returns a client for the system at baseURL (for example
// "http://127.0.0.1:8081"). Every call gives up at its deadline, timeout
// after it is prepared (Deadline), or when its context ends.
func NewClient(system, baseURL string, timeout time.Duration) *Client {
	// A Transport of our own rather than http.DefaultTransport: sized for one
	// busy host, and idle connections expire instead of lingering forever.
	// A call that times out has its connection closed by the Transport, never
	// returned to the pool, so a late answer cannot be read by the next call.
	transport := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   timeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{
		system:  system,
		baseURL: strings.TrimRight(baseURL, "/"),
		timeout: timeout,
		// Every call carries its operation's trace (a traceparent header).
		http:  &http.Client{Transport: tracing.Transport(transport)},
		conns: transport,
	}
}

// Timeout is how long a call may take, from the moment its deadline is chosen.
func (c *Client) Timeout() time.Duration { return c.timeout }

// Deadline is the deadline a call prepared now carries: the caller's clock
// plus the timeout, rounded up to the millisecond (the header's precision),
// so the caller waits at least its timeout. A caller that must record the
// deadline before sending takes it here, records it, and passes it in
// Call.Deadline.
func (c *Client) Deadline() time.Time {
	d := time.Now().Add(c.timeout)
	if t := d.Truncate(time.Millisecond); t.Before(d) {
		return t.Add(time.Millisecond)
	}
	return d
}

// CloseIdleConnections closes the client's idle keep-alive connections. Call
// it at shutdown; calls in flight are not affected.
func (c *Client) CloseIdleConnections() { c.conns.CloseIdleConnections() }

// Call is one keyed, mutating call.
type Call struct {
	Path string // e.g. "/v1/cancellations"
	Key  string // the Idempotency-Key: 1 to 255 visible ASCII characters
	Body any    // sent as JSON
	// Deadline is the latest moment the system may apply the call. Zero
	// means Deadline(): now plus the timeout.
	Deadline time.Time
}

// Send POSTs call and classifies the answer (see Client). The error is
// non-nil only when nothing was sent: call is invalid (ErrInvalidRequest),
// ctx was already done, or the deadline had passed (ErrDeadlinePassed).
// From the moment the request may have left, every failure is an Unknown
// Result with Err set — never an error, never Rejected.
func (c *Client) Send(ctx context.Context, call Call) (Result, error) {
	if !ValidKey(call.Key) {
		return Result{}, fmt.Errorf("%w: key %q", ErrInvalidRequest, call.Key)
	}
	deadline := call.Deadline
	if deadline.IsZero() {
		deadline = c.Deadline()
	}
	deadline = deadline.Truncate(time.Millisecond)
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("%s: %s not sent: %w", c.system, call.Key, err)
	}
	if !time.Now().Before(deadline) {
		return Result{}, fmt.Errorf("%s: %s not sent: %w (%s)", c.system, call.Key, ErrDeadlinePassed, FormatDeadline(deadline))
	}
	body, err := json.Marshal(call.Body)
	if err != nil {
		return Result{}, fmt.Errorf("%w: encode body: %v", ErrInvalidRequest, err)
	}

	// The client stops waiting at the very moment the system stops
	// accepting: one instant, on the caller's clock.
	ctx, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+call.Path, bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", call.Key)
	req.Header.Set(DeadlineHeader, FormatDeadline(deadline))

	status, answer, err := c.do(req)
	unknown := func(cause error) Result {
		return Result{Outcome: Unknown, Deadline: deadline,
			Err: fmt.Errorf("%s: %s %s: %w", c.system, call.Path, call.Key, cause)}
	}
	if err != nil {
		// From here on the request may have reached the system: whatever
		// went wrong, the only honest classification is Unknown.
		return unknown(err), nil
	}
	switch status {
	case http.StatusOK:
		return Result{Outcome: Confirmed, Truth: TruthCompleted, Deadline: deadline}, nil
	case http.StatusUnprocessableEntity:
		return Result{Outcome: Rejected, Truth: TruthRejected, Reason: answer.Reason, Deadline: deadline}, nil
	case http.StatusAccepted:
		res := unknown(errors.New("accepted, still running"))
		res.Truth = TruthRunning
		return res, nil
	default:
		return unknown(answer.statusErr), nil
	}
}

// Status asks for the truth of key at path/{key}. 200 carries the truth; 404
// carries NOT_STARTED only if its body says so, since a 404 from a wrong base
// URL must not read as "never started" (that would invite a retry that
// doubles the effect on a system that is not idempotent). Anything else is
// an error wrapping ErrUnreachable.
//
// A NOT_STARTED answer describes the past: it says no call with the key had
// arrived when the system answered, not that none is on its way. See the
// package doc on deadlines.
func (c *Client) Status(ctx context.Context, path, key string) (Truth, error) {
	if !ValidKey(key) {
		return "", fmt.Errorf("%w: key %q", ErrInvalidRequest, key)
	}
	ctx, stop := context.WithTimeout(ctx, c.timeout)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+path+"/"+url.PathEscape(key), nil)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	status, answer, err := c.do(req)
	if err != nil {
		return "", fmt.Errorf("%s: status %s: %w: %w", c.system, key, ErrUnreachable, err)
	}
	switch {
	case status == http.StatusOK && answer.Status.Valid() && answer.Status != TruthNotStarted,
		status == http.StatusNotFound && answer.Status == TruthNotStarted:
		return answer.Status, nil
	default:
		return "", fmt.Errorf("%s: status %s: %w: %w", c.system, key, ErrUnreachable, answer.statusErr)
	}
}

// answerBody is the JSON every system answers with.
type answerBody struct {
	Status Truth  `json:"status"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// decoded is an answer read off the wire: the JSON if it parsed, and a
// StatusError ready in case the caller finds the status unexpected.
type decoded struct {
	answerBody
	statusErr *StatusError
}

// do sends req and reads the whole answer (bounded by maxBody), always
// closing the body: a body left open pins its connection, and one left
// unread cannot be reused for the next call.
func (c *Client) do(req *http.Request) (int, decoded, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, decoded{}, transportError(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		// The status line arrived but the body did not: the answer is lost.
		return 0, decoded{}, fmt.Errorf("read answer (HTTP %d): %w", resp.StatusCode, transportError(err))
	}
	var d decoded
	_ = json.Unmarshal(raw, &d.answerBody) // an unreadable body leaves zero values; callers check them
	d.statusErr = &StatusError{StatusCode: resp.StatusCode, Body: truncate(string(raw), 200), Code: d.Error}
	return resp.StatusCode, d, nil
}

// netError is a transport failure described without the system's address
// (these texts end up in operations' last_error, which customers see); the
// full error stays reachable through errors.Is and errors.As.
type netError struct {
	text  string
	cause error
}

func (e *netError) Error() string { return e.text }
func (e *netError) Unwrap() error { return e.cause }

func transportError(err error) error {
	var text string
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		text = "no answer before the deadline"
	case errors.Is(err, context.Canceled):
		text = "the caller stopped waiting"
	case errors.Is(err, syscall.ECONNREFUSED):
		text = "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		text = "connection closed before an answer"
	default:
		text = "network error"
	}
	return &netError{text: text, cause: err}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
