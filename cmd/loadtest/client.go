package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// client sends the run's requests to one app and records every answer.
// Setup and verdict calls (reset, listings, invariants) go through admin
// methods that are not recorded: the figures are about the workload only.
type client struct {
	base    string
	http    *http.Client
	limit   *limiter // nil: no rate cap
	rec     *recorder
	adminTo string
}

func newClient(cfg config, rec *recorder) *client {
	// Copies of one request go out at the same moment, so allow a few idle
	// connections per client.
	tr := &http.Transport{
		Proxy:               nil, // the target URL only, never a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        cfg.Concurrency * 4,
		MaxIdleConnsPerHost: cfg.Concurrency * 4,
		IdleConnTimeout:     30 * time.Second,
	}
	c := &client{
		base: cfg.URL,
		// A provider call may take PROVIDER_TIMEOUT (2 s by default) before
		// the app answers 202; 30 s means something is wrong.
		http:    &http.Client{Transport: tr, Timeout: 30 * time.Second},
		rec:     rec,
		adminTo: cfg.AdminToken,
	}
	if cfg.Rate > 0 {
		c.limit = &limiter{every: time.Duration(float64(time.Second) / cfg.Rate)}
	}
	return c
}

// request is one API call of the workload.
type request struct {
	method string
	path   string
	token  string
	key    string // Idempotency-Key; "" sends none
	body   []byte
}

// answer is what the app said to one request.
type answer struct {
	status   int
	problem  string // the problem+json "type", for errors
	replayed bool   // Idempotent-Replayed: true
	body     []byte
	latency  time.Duration
	err      error // no answer at all (refused, reset, timed out)
}

// label names the answer in the report: "201", "409 slot-taken",
// "no answer: connection refused".
func (a answer) label() string {
	switch {
	case a.err != nil:
		return "no answer: " + transportCause(a.err)
	case a.problem != "":
		return fmt.Sprintf("%d %s", a.status, a.problem)
	default:
		return fmt.Sprint(a.status)
	}
}

// inFlight: the key's first request is still executing (409 request-in-progress).
func (a answer) inFlight() bool {
	return a.status == http.StatusConflict && a.problem == "request-in-progress"
}

// send makes one recorded request. A context ended by the caller (Ctrl-C)
// is not an answer and is not recorded.
func (c *client) send(ctx context.Context, r request) answer {
	if c.limit != nil {
		if err := c.limit.wait(ctx); err != nil {
			return answer{err: err}
		}
	}
	a := c.do(ctx, r)
	if ctx.Err() == nil {
		c.rec.record(a)
	}
	return a
}

func (c *client) do(ctx context.Context, r request) answer {
	req, err := http.NewRequestWithContext(ctx, r.method, c.base+r.path, bytes.NewReader(r.body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.key != "" {
		req.Header.Set("Idempotency-Key", r.key)
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{err: err, latency: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	a := answer{
		status:   resp.StatusCode,
		replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		body:     body,
		latency:  time.Since(start),
		err:      err,
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(body, &p) == nil {
			a.problem = p.Type
		}
	}
	return a
}

// admin calls an admin endpoint outside the recorded workload and decodes
// its JSON answer into out (when not nil).
func (c *client) admin(ctx context.Context, method, path string, in, out any) error {
	return c.call(ctx, c.adminTo, method, path, in, out)
}

// call is an unrecorded request with token that must answer 2xx.
func (c *client) call(ctx context.Context, token, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	a := c.do(ctx, request{method: method, path: path, token: token, body: body})
	switch {
	case a.err != nil:
		return fmt.Errorf("%s %s: %w", method, path, a.err)
	case a.status/100 != 2:
		return fmt.Errorf("%s %s: %d %s", method, path, a.status, bytes.TrimSpace(a.body))
	case out != nil:
		if err := json.Unmarshal(a.body, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

func (c *client) close() { c.http.CloseIdleConnections() }

// transportCause says in a few words why a request got no answer, so the
// report groups them ("connection refused", not one line per port).
func transportCause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection reset"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	default:
		return "transport error"
	}
}

// limiter spaces requests every `every` across all clients: a simple
// schedule of start times, no bursts.
type limiter struct {
	mu    sync.Mutex
	every time.Duration
	next  time.Time
}

func (l *limiter) wait(ctx context.Context) error {
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(l.every)
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
