package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Control drives a fake provider's control API (faults, effects, reset) over
// HTTP, so the app's admin endpoints work the same whether the provider runs
// in-process or in another process. Its methods mirror Provider's: code that
// needs them can take either through an interface of its own.
type Control struct {
	baseURL string
	http    *http.Client
}

// NewControl returns a Control for the provider at baseURL (for example
// "http://127.0.0.1:8081"). Each call gives up after 5 seconds.
func NewControl(baseURL string) *Control {
	return &Control{
		baseURL: strings.TrimRight(baseURL, "/"),
		// its own Transport, so CloseIdleConnections closes only these
		http: &http.Client{Timeout: 5 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()},
	}
}

// Faults returns the provider's whole fault configuration.
func (c *Control) Faults(ctx context.Context) (Config, error) {
	var cfg Config
	err := c.do(ctx, http.MethodGet, "/v1/faults", nil, &cfg)
	return cfg, err
}

// SetFaults applies one fault setting (see Provider.SetFaults) and returns
// the resulting configuration. A fault the provider refuses returns an error
// wrapping ErrInvalidFault.
func (c *Control) SetFaults(ctx context.Context, f Fault) (Config, error) {
	var cfg Config
	err := c.do(ctx, http.MethodPut, "/v1/faults", f, &cfg)
	return cfg, err
}

// Effects returns the provider's effects ledger, summed per policy.
func (c *Control) Effects(ctx context.Context) (Effects, error) {
	var e Effects
	err := c.do(ctx, http.MethodGet, "/v1/effects", nil, &e)
	return e, err
}

// Reset makes the provider forget every request and effect and restores the
// default faults.
func (c *Control) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/reset", nil, nil)
}

// CloseIdleConnections closes the control client's idle connections.
func (c *Control) CloseIdleConnections() { c.http.CloseIdleConnections() }

// do sends one control request and decodes a 2xx answer into out (if not
// nil). A 400 becomes ErrInvalidFault carrying the provider's message.
func (c *Control) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("fake: control %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return fmt.Errorf("fake: control %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("fake: control %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("fake: control %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e errorBody
		_ = json.Unmarshal(raw, &e)
		if resp.StatusCode == http.StatusBadRequest && e.Error == "invalid_fault" {
			return fmt.Errorf("%w: %s", ErrInvalidFault, e.Message)
		}
		return fmt.Errorf("fake: control %s %s: HTTP %d: %s", method, path, resp.StatusCode, e.Message)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("fake: control %s %s: decode answer: %w", method, path, err)
	}
	return nil
}
