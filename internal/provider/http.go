package provider

import (
	"context"
	"fmt"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// DefaultTimeout is the per-call timeout when none is given (PROVIDER_TIMEOUT).
const DefaultTimeout = 2 * time.Second

// HTTPClient calls the provider's HTTP API:
//
//	POST /v1/cancellations        Idempotency-Key, Request-Deadline, {"policy_id", "reason"}
//	GET  /v1/cancellations/{key}  the truth of a key
//
// The sending, the deadline and the classification are external.Client's;
// this type names the provider's paths and body. It is safe for concurrent
// use.
type HTTPClient struct {
	c *external.Client
}

var _ Client = (*HTTPClient)(nil)

// NewHTTPClient returns a client for the provider at baseURL (for example
// "http://127.0.0.1:8081"). Every call gives up at its deadline — timeout
// (DefaultTimeout when timeout <= 0) after it is prepared — or when its
// context ends, whichever comes first.
func NewHTTPClient(baseURL string, timeout time.Duration) *HTTPClient {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &HTTPClient{external.NewClient("provider", baseURL, timeout)}
}

// Deadline is the deadline a call prepared now carries: now plus the timeout.
func (c *HTTPClient) Deadline() time.Time { return c.c.Deadline() }

// CloseIdleConnections closes the client's idle keep-alive connections. Call
// it at shutdown; calls in flight are not affected.
func (c *HTTPClient) CloseIdleConnections() { c.c.CloseIdleConnections() }

// cancelBody is the JSON the provider takes.
type cancelBody struct {
	PolicyID int64  `json:"policy_id"`
	Reason   string `json:"reason"`
}

// Cancel asks the provider to cancel req.PolicyID under req.Key, carrying
// req.Deadline (or one chosen now). The answer is classified by HTTP status
// alone, the provider's contract:
//
//	200          Confirmed (TruthCompleted)
//	422          Rejected (TruthRejected), with the provider's reason
//	202          Unknown (TruthRunning): accepted, not finished
//	anything else, a timeout, a network error: Unknown, with Err set
//
// Result.Deadline is the deadline the call carried. The error is non-nil only
// when no request was sent: req is invalid (ErrInvalidRequest), ctx was
// already done, or the deadline had passed (ErrDeadlinePassed).
func (c *HTTPClient) Cancel(ctx context.Context, req CancelRequest) (Result, error) {
	if req.PolicyID <= 0 {
		return Result{}, fmt.Errorf("%w: policy id %d", ErrInvalidRequest, req.PolicyID)
	}
	return c.c.Send(ctx, external.Call{
		Path:     "/v1/cancellations",
		Key:      req.Key,
		Body:     cancelBody{PolicyID: req.PolicyID, Reason: req.Reason},
		Deadline: req.Deadline,
	})
}

// Status asks the provider for the truth of key: NOT_STARTED, RUNNING,
// COMPLETED or REJECTED, or an error wrapping ErrUnreachable. See
// external.Client.Status.
func (c *HTTPClient) Status(ctx context.Context, key string) (Truth, error) {
	return c.c.Status(ctx, "/v1/cancellations", key)
}
