// Package workload is the chaos run's clients: simulated customers who
// cancel policies, book slots and release their bookings through the two
// app instances, each intent under one Idempotency-Key, retried with that
// key — on either instance — until it gets a final answer. Every attempt
// goes into the history, answered or not.
//
// A client behaves the way the protocol asks a good client to: it never
// mints a new key for a retry, it waits as long as Retry-After says, and it
// treats no answer, a 5xx and "still in progress" alike as "ask again". It
// is also impatient in the ways real clients are — its own timeout, and now
// and then two copies of a request at once — because that is what makes a
// key be owned, lost and taken over.
package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// Instance is one app instance clients can send to.
type Instance struct {
	Name string
	URL  string
}

// sender sends one attempt and turns what came back into a history.Attempt.
type sender struct {
	http *http.Client
}

func newSender(timeout time.Duration) *sender {
	return &sender{http: &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     30 * time.Second,
		},
	}}
}

// send makes one attempt of in against inst.
func (s *sender) send(ctx context.Context, inst Instance, in *history.Intent) history.Attempt {
	a := history.Attempt{Instance: inst.Name, Sent: time.Now()}
	var body io.Reader
	if in.Body != nil {
		body = bytes.NewReader(in.Body)
	}
	req, err := http.NewRequestWithContext(ctx, in.Method, inst.URL+in.Path, body)
	if err != nil {
		a.Err, a.Done = err.Error(), time.Now()
		return a
	}
	req.Header.Set("Authorization", "Bearer "+in.Token)
	req.Header.Set("Idempotency-Key", in.Key)
	if in.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		a.Err, a.Done = cause(err), time.Now()
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a.Done = time.Now()
	if err != nil {
		// Headers without a whole body: no answer the client can use.
		a.Err = "body cut: " + cause(err)
		return a
	}
	a.Status, a.Body = resp.StatusCode, b
	a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	a.RequestID = resp.Header.Get("X-Request-Id")
	a.RetryAfter = resp.Header.Get("Retry-After")
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(b, &p) == nil {
			a.Problem = p.Type
		}
	}
	return a
}

func (s *sender) close() { s.http.CloseIdleConnections() }

// cause says in a few words why there was no answer, so figures group them.
func cause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection reset"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "transport error"
	}
}

// Replayer sends intents again, unrecorded: the checks' replay of every
// answered key after the drain.
type Replayer struct{ s *sender }

// NewReplayer returns a Replayer whose attempts time out after timeout.
func NewReplayer(timeout time.Duration) *Replayer { return &Replayer{newSender(timeout)} }

// Send sends in's request once more to inst.
func (r *Replayer) Send(ctx context.Context, inst Instance, in *history.Intent) history.Attempt {
	return r.s.send(ctx, inst, in)
}

// Close closes idle connections.
func (r *Replayer) Close() { r.s.close() }
