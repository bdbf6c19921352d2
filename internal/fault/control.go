package fault

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

// ControlClient drives a fake's control API over HTTP, so the app's admin
// endpoints work the same whether the fake runs in this process or in
// another one. Each fake's Control embeds it and adds its ledger.
type ControlClient struct {
	baseURL string
	token   string
	http    *http.Client
}

// NewControlClient returns a client for the control API at baseURL (for
// example "http://127.0.0.1:8081"), sending token as a bearer token when it
// is not empty (Access.Token). Each call gives up after 5 seconds.
func NewControlClient(baseURL, token string) *ControlClient {
	return &ControlClient{
		baseURL: strings.TrimRight(baseURL, "/"),
		token:   token,
		// its own Transport, so CloseIdleConnections closes only these
		http: &http.Client{Timeout: 5 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()},
	}
}

// Faults returns the fake's whole fault configuration.
func (c *ControlClient) Faults(ctx context.Context) (Config, error) {
	var cfg Config
	err := c.Do(ctx, http.MethodGet, "/v1/faults", nil, &cfg)
	return cfg, err
}

// SetFaults applies one fault setting (see Store.Set) and returns the
// resulting configuration. A fault the fake refuses returns an
// *InvalidError naming the field (errors.Is ErrInvalidFault).
func (c *ControlClient) SetFaults(ctx context.Context, f Fault) (Config, error) {
	var cfg Config
	err := c.Do(ctx, http.MethodPut, "/v1/faults", f, &cfg)
	return cfg, err
}

// Reset makes the fake forget every request and effect and restores the
// default faults.
func (c *ControlClient) Reset(ctx context.Context) error {
	return c.Do(ctx, http.MethodPost, "/v1/reset", nil, nil)
}

// CloseIdleConnections closes the control client's idle connections.
func (c *ControlClient) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Do sends one control request (in as JSON when not nil) and decodes a 2xx
// answer into out (when not nil). A 422 invalid_fault becomes an
// *InvalidError; any other failure names the method and path, never the
// fake's address.
func (c *ControlClient) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("fault: control %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return fmt.Errorf("fault: control %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("fault: control %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("fault: control %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e ErrorBody
		_ = json.Unmarshal(raw, &e)
		if e.Error == "invalid_fault" {
			return &InvalidError{Field: e.Field, Message: e.Message}
		}
		return fmt.Errorf("fault: control %s %s: HTTP %d: %s", method, path, resp.StatusCode, e.Message)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("fault: control %s %s: decode answer: %w", method, path, err)
	}
	return nil
}
