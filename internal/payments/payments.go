package payments

import (
	"context"
	"fmt"
	"time"

	"github.com/idemlab/idemlab/internal/external"
)

// DefaultTimeout is the per-call timeout when none is given (PAYMENTS_TIMEOUT).
const DefaultTimeout = 2 * time.Second

// MaxAmountCents bounds one charge or refund (1,000,000.00), as the service does.
const MaxAmountCents = 100_000_000

// Client is what idemlab needs from the payments service. HTTPClient
// implements it; tests may substitute their own.
type Client interface {
	// Deadline is the deadline a call prepared now would carry: take it,
	// record it, then pass it in the request.
	Deadline() time.Time
	// Charge and Refund send one call. A non-nil error means nothing was
	// sent (invalid arguments, a context already done, a deadline already
	// passed); otherwise the Result says how it ended.
	Charge(ctx context.Context, req ChargeRequest) (external.Result, error)
	Refund(ctx context.Context, req RefundRequest) (external.Result, error)
	// ChargeStatus and RefundStatus report the service's truth for a key, or
	// an error wrapping external.ErrUnreachable — never NOT_STARTED for
	// "could not ask".
	ChargeStatus(ctx context.Context, key string) (external.Truth, error)
	RefundStatus(ctx context.Context, key string) (external.Truth, error)
}

// ChargeRequest is one charge: for a booking (a deposit) or a policy,
// exactly one of the two.
type ChargeRequest struct {
	Key         string // the step key; 1 to 255 visible ASCII characters
	BookingID   int64
	PolicyID    int64
	AmountCents int64 // 1 to MaxAmountCents
	Description string
	Deadline    time.Time // zero: Deadline(), now plus the timeout
}

// RefundRequest is one refund: of a charge (ChargeKey) or of a policy's
// premium paid elsewhere (PolicyID), exactly one of the two.
type RefundRequest struct {
	Key         string
	ChargeKey   string
	PolicyID    int64
	AmountCents int64
	Reason      string
	Deadline    time.Time
}

// HTTPClient calls the payments service's HTTP API. It is safe for
// concurrent use.
type HTTPClient struct {
	c *external.Client
}

var _ Client = (*HTTPClient)(nil)

// NewHTTPClient returns a client for the service at baseURL (for example
// "http://127.0.0.1:8082"). Every call gives up at its deadline — timeout
// (DefaultTimeout when timeout <= 0) after it is prepared — or when its
// context ends.
func NewHTTPClient(baseURL string, timeout time.Duration) *HTTPClient {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &HTTPClient{external.NewClient("payments", baseURL, timeout)}
}

// Deadline is the deadline a call prepared now carries.
func (c *HTTPClient) Deadline() time.Time { return c.c.Deadline() }

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *HTTPClient) CloseIdleConnections() { c.c.CloseIdleConnections() }

type chargeBody struct {
	PolicyID    *int64 `json:"policy_id,omitempty"`
	BookingID   *int64 `json:"booking_id,omitempty"`
	AmountCents int64  `json:"amount_cents"`
	Description string `json:"description"`
}

// Charge asks the service to charge req.AmountCents under req.Key: 200
// Confirmed, 422 Rejected (declined), anything else Unknown.
func (c *HTTPClient) Charge(ctx context.Context, req ChargeRequest) (external.Result, error) {
	if (req.PolicyID > 0) == (req.BookingID > 0) || req.PolicyID < 0 || req.BookingID < 0 {
		return external.Result{}, fmt.Errorf("%w: a charge is for a booking or a policy (booking %d, policy %d)",
			external.ErrInvalidRequest, req.BookingID, req.PolicyID)
	}
	if err := validAmount(req.AmountCents); err != nil {
		return external.Result{}, err
	}
	return c.c.Send(ctx, external.Call{
		Path: "/v1/charges",
		Key:  req.Key,
		Body: chargeBody{PolicyID: positive(req.PolicyID), BookingID: positive(req.BookingID),
			AmountCents: req.AmountCents, Description: req.Description},
		Deadline: req.Deadline,
	})
}

type refundBody struct {
	ChargeKey   *string `json:"charge_key,omitempty"`
	PolicyID    *int64  `json:"policy_id,omitempty"`
	AmountCents int64   `json:"amount_cents"`
	Reason      string  `json:"reason"`
}

// Refund asks the service to refund req.AmountCents under req.Key: 200
// Confirmed, 422 Rejected (nothing to refund, more than remains, refused),
// anything else Unknown.
func (c *HTTPClient) Refund(ctx context.Context, req RefundRequest) (external.Result, error) {
	if (req.ChargeKey != "") == (req.PolicyID > 0) || req.PolicyID < 0 {
		return external.Result{}, fmt.Errorf("%w: a refund is of a charge or a policy (charge %q, policy %d)",
			external.ErrInvalidRequest, req.ChargeKey, req.PolicyID)
	}
	if req.ChargeKey != "" && !external.ValidKey(req.ChargeKey) {
		return external.Result{}, fmt.Errorf("%w: charge key %q", external.ErrInvalidRequest, req.ChargeKey)
	}
	if err := validAmount(req.AmountCents); err != nil {
		return external.Result{}, err
	}
	body := refundBody{PolicyID: positive(req.PolicyID), AmountCents: req.AmountCents, Reason: req.Reason}
	if req.ChargeKey != "" {
		body.ChargeKey = &req.ChargeKey
	}
	return c.c.Send(ctx, external.Call{Path: "/v1/refunds", Key: req.Key, Body: body, Deadline: req.Deadline})
}

// ChargeStatus asks for the truth of a charge key.
func (c *HTTPClient) ChargeStatus(ctx context.Context, key string) (external.Truth, error) {
	return c.c.Status(ctx, "/v1/charges", key)
}

// RefundStatus asks for the truth of a refund key.
func (c *HTTPClient) RefundStatus(ctx context.Context, key string) (external.Truth, error) {
	return c.c.Status(ctx, "/v1/refunds", key)
}

func validAmount(cents int64) error {
	if cents < 1 || cents > MaxAmountCents {
		return fmt.Errorf("%w: amount %d cents (want 1 to %d)", external.ErrInvalidRequest, cents, MaxAmountCents)
	}
	return nil
}

func positive(id int64) *int64 {
	if id <= 0 {
		return nil
	}
	return &id
}
