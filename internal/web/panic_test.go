package web

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/testdb"
)

// A handler that panics is answered 500 with a problem that says nothing
// of the panic, and the panic (with its stack) goes to the log under the
// request id.
func TestPanicsAreRecoveredAndLoggedNotShown(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var logs syncBuffer
	app := New(Config{BodyLimit: "1M"}, Deps{
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Pool:     db.Pool,
		Registry: prometheus.NewRegistry(),
	})
	e := app.routes()
	e.GET("/api/v1/boom", func(echo.Context) error { panic("secret internals: the vault combination is 1234") })

	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/boom", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != http.StatusInternalServerError || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("panic answered %d %s: %s", rec.Code, rec.Header().Get("Content-Type"), body)
	}
	if bytes.Contains(body, []byte("vault")) || bytes.Contains(body, []byte("goroutine")) {
		t.Fatalf("the answer leaks the panic: %s", body)
	}
	id := rec.Header().Get(echo.HeaderXRequestID)
	if l := logs.String(); !strings.Contains(l, "vault combination") || !strings.Contains(l, "request_id="+id) || !strings.Contains(l, "panic_test.go") {
		t.Fatalf("the log lacks the panic, its stack or the request id %q:\n%s", id, l)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A client that leaves mid-request (a browser navigating away while htmx
// polls) is not a server error: no "unhandled error", no 500 in the log or
// in the metrics (issue 29, finding 23) — nor a 502 blamed on a fake whose
// control call the leaving cut short.
func TestAClientThatLeftIsNotAServerError(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	app := New(Config{BodyLimit: "1M"}, Deps{
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Pool:     db.Pool,
		Registry: reg,
	})
	e := app.routes()
	e.GET("/left", func(c echo.Context) error { return c.Request().Context().Err() })
	e.GET("/left-mid-control", func(c echo.Context) error {
		// What the provider's control client returns when the request's
		// context ends under it.
		return app.providerAdmin().controlError(c, &url.Error{Op: "Get", URL: "http://provider/v1/faults", Err: c.Request().Context().Err()})
	})
	for _, path := range []string{"/left", "/left-mid-control"} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx))
	}
	l := logs.String()
	if strings.Contains(l, "unhandled error") || strings.Contains(l, "status=500") || strings.Contains(l, "status=502") ||
		strings.Count(l, "status=499") != 2 {
		t.Fatalf("a client that left was logged as a server error:\n%s", l)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for _, f := range families {
		if f.GetName() != "idemlab_http_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "status" {
					statuses = append(statuses, lp.GetValue())
				}
			}
		}
	}
	if strings.Join(statuses, ",") != "499,499" {
		t.Errorf("the metrics count the two requests under statuses %v, want 499 twice", statuses)
	}
}
