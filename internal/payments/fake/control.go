package fake

import (
	"context"
	"net/http"

	"github.com/idemlab/idemlab/internal/fault"
)

// Control drives a payments service's control API (faults, ledger, reset)
// over HTTP, wherever the service runs. Its methods mirror Payments'.
type Control struct {
	*fault.ControlClient // Faults, SetFaults, Reset, CloseIdleConnections
}

// NewControl returns a Control for the service at baseURL, sending token as
// its bearer token when not empty (Options.Control.Token,
// FAKE_CONTROL_TOKEN). Each call gives up after 5 seconds.
func NewControl(baseURL, token string) *Control {
	return &Control{fault.NewControlClient(baseURL, token)}
}

// Ledger returns the service's ledger.
func (c *Control) Ledger(ctx context.Context) (Ledger, error) {
	var l Ledger
	err := c.Do(ctx, http.MethodGet, "/v1/ledger", nil, &l)
	return l, err
}
