package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultTimeout is the per-call timeout when none is given (PROVIDER_TIMEOUT).
const DefaultTimeout = 2 * time.Second

// maxBody bounds how much of an answer the client reads. Answers are a few
// bytes of JSON; anything bigger is not the provider we know.
const maxBody = 64 << 10

// HTTPClient calls the provider's HTTP API:
//
//	POST /v1/cancellations        Idempotency-Key header, {"policy_id", "reason"}
//	GET  /v1/cancellations/{key}  the truth of a key
//
// It is safe for concurrent use. It owns its Transport, so CloseIdleConnections
// affects only connections to the provider.
type HTTPClient struct {
	baseURL string
	timeout time.Duration
	http    *http.Client
}

var _ Client = (*HTTPClient)(nil)

// NewHTTPClient returns a client for the provider at baseURL (for example
// "http://127.0.0.1:8081"). Every call gives up after timeout (DefaultTimeout
// when timeout <= 0) or when its context ends, whichever comes first.
func NewHTTPClient(baseURL string, timeout time.Duration) *HTTPClient {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
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
	return &HTTPClient{
		baseURL: strings.TrimRight(baseURL, "/"),
		timeout: timeout,
		http:    &http.Client{Transport: transport},
	}
}

// CloseIdleConnections closes the client's idle keep-alive connections. Call it
// at shutdown; calls in flight are not affected.
func (c *HTTPClient) CloseIdleConnections() { c.http.CloseIdleConnections() }

// cancelBody is the JSON the provider takes and answerBody the JSON it gives.
type cancelBody struct {
	PolicyID int64  `json:"policy_id"`
	Reason   string `json:"reason"`
}

type answerBody struct {
	Status Truth  `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// Cancel asks the provider to cancel req.PolicyID under req.Key.
//
// The answer is classified by HTTP status alone, the provider's contract:
//
//	200          Confirmed (TruthCompleted)
//	422          Rejected (TruthRejected), with the provider's reason
//	202          Unknown (TruthRunning): accepted, not finished
//	anything else, a timeout, a network error: Unknown, with Err set
//
// The error is non-nil only when no request was sent: req is invalid
// (ErrInvalidRequest) or ctx was already done.
func (c *HTTPClient) Cancel(ctx context.Context, req CancelRequest) (Result, error) {
	if !ValidKey(req.Key) {
		return Result{}, fmt.Errorf("%w: key %q", ErrInvalidRequest, req.Key)
	}
	if req.PolicyID <= 0 {
		return Result{}, fmt.Errorf("%w: policy id %d", ErrInvalidRequest, req.PolicyID)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("provider: cancel not sent: %w", err)
	}
	body, err := json.Marshal(cancelBody{PolicyID: req.PolicyID, Reason: req.Reason})
	if err != nil {
		return Result{}, fmt.Errorf("provider: encode cancel: %w", err)
	}

	ctx, stop := context.WithTimeout(ctx, c.timeout)
	defer stop()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/cancellations", bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Idempotency-Key", req.Key)

	status, answer, err := c.do(hreq)
	if err != nil {
		// From here on the request may have reached the provider: whatever
		// went wrong, the only honest classification is Unknown.
		return Result{Outcome: Unknown, Err: fmt.Errorf("provider: cancel %s: %w", req.Key, err)}, nil
	}
	switch status {
	case http.StatusOK:
		return Result{Outcome: Confirmed, Truth: TruthCompleted}, nil
	case http.StatusUnprocessableEntity:
		return Result{Outcome: Rejected, Truth: TruthRejected, Reason: answer.Reason}, nil
	case http.StatusAccepted:
		return Result{Outcome: Unknown, Truth: TruthRunning,
			Err: fmt.Errorf("provider: cancel %s: accepted, still running", req.Key)}, nil
	default:
		return Result{Outcome: Unknown, Err: fmt.Errorf("provider: cancel %s: %w", req.Key, answer.statusErr)}, nil
	}
}

// Status asks the provider for the truth of key. 200 carries the truth; 404
// carries NOT_STARTED only if its body says so, since a 404 from a wrong
// PROVIDER_URL must not read as "never started" (that would invite a retry
// that doubles the effect on a provider that is not idempotent). Anything
// else is an error wrapping ErrUnreachable.
func (c *HTTPClient) Status(ctx context.Context, key string) (Truth, error) {
	if !ValidKey(key) {
		return "", fmt.Errorf("%w: key %q", ErrInvalidRequest, key)
	}
	ctx, stop := context.WithTimeout(ctx, c.timeout)
	defer stop()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+"/v1/cancellations/"+url.PathEscape(key), nil)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	status, answer, err := c.do(hreq)
	if err != nil {
		return "", fmt.Errorf("%w: status %s: %w", ErrUnreachable, key, err)
	}
	switch {
	case status == http.StatusOK && answer.Status.Valid() && answer.Status != TruthNotStarted,
		status == http.StatusNotFound && answer.Status == TruthNotStarted:
		return answer.Status, nil
	default:
		return "", fmt.Errorf("%w: status %s: %w", ErrUnreachable, key, answer.statusErr)
	}
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
func (c *HTTPClient) do(req *http.Request) (int, decoded, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, decoded{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		// The status line arrived but the body did not: the answer is lost.
		return 0, decoded{}, fmt.Errorf("read answer (HTTP %d): %w", resp.StatusCode, err)
	}
	var d decoded
	_ = json.Unmarshal(raw, &d.answerBody) // an unreadable body leaves zero values; callers check them
	d.statusErr = &StatusError{StatusCode: resp.StatusCode, Body: truncate(string(raw), 200)}
	return resp.StatusCode, d, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
