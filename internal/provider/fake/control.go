package fake

import (
	"context"
	"net/http"

	"github.com/idemlab/idemlab/internal/fault"
)

// Control drives a fake provider's control API (faults, effects, reset) over
// HTTP, so the app's admin endpoints work the same whether the provider runs
// in-process or in another process. Its methods mirror Provider's: code that
// needs them can take either through an interface of its own.
type Control struct {
	*fault.ControlClient // Faults, SetFaults, Reset, CloseIdleConnections
}

// NewControl returns a Control for the provider at baseURL (for example
// "http://127.0.0.1:8081") that sends no token: enough for a provider whose
// control API admits loopback callers (the default Options.Control). Each
// call gives up after 5 seconds.
func NewControl(baseURL string) *Control { return NewControlWithToken(baseURL, "") }

// NewControlWithToken returns a Control that sends token as its bearer token
// (Options.Control.Token, FAKE_CONTROL_TOKEN) when it is not empty.
func NewControlWithToken(baseURL, token string) *Control {
	return &Control{fault.NewControlClient(baseURL, token)}
}

// Effects returns the provider's effects ledger, summed per policy.
func (c *Control) Effects(ctx context.Context) (Effects, error) {
	var e Effects
	err := c.Do(ctx, http.MethodGet, "/v1/effects", nil, &e)
	return e, err
}
