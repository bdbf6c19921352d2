package database_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/pgcluster"
)

func TestIsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P03"}, true},                // starting up
		{&pgconn.PgError{Code: "57P01"}, true},                // shutting down
		{&pgconn.PgError{Code: "08006"}, true},                // connection failure
		{fmt.Errorf("slots: %w", pgconn.ErrConnClosed), true}, // dead connection
		{&pgconn.PgError{Code: "23505"}, false},               // a refused statement
		{&pgconn.PgError{Code: "55P03"}, false},               // a lock wait: not an outage
		{context.DeadlineExceeded, false},                     // someone's timeout
		{errors.New("policies: operation not found"), false},  // a domain error
		{fmt.Errorf("x: %w", database.ErrUnavailable), true},  // marked by hand
		{nil, false},
		// pgx hands a dead socket's error back unwrapped.
		{fmt.Errorf("users: %w", io.ErrUnexpectedEOF), true},
		{fmt.Errorf("users: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true},
		// The same failures inside an HTTP call are the called service's.
		{fmt.Errorf("labs: %w", &url.Error{Op: "Put", URL: "http://provider/v1/faults",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}), false},
	} {
		if got := database.IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Finding 27 of issue 29: with the provider away, a lab answered "database
// unavailable". The classification goes by where the error came from: the
// same refused connection and the same EOF count when the driver reports
// them, and do not when an HTTP client does (a *url.Error).
func TestIsUnavailableByOrigin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// An HTTP server that is not there, and one that hangs up mid-answer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	_, refused := http.Get(gone)
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer hangUp.Close()
	_, eof := http.Get(hangUp.URL)
	for name, err := range map[string]error{"refused": refused, "hang-up": eof} {
		// A reset, too: on a busy machine another test may take the closed
		// port between Close and Get and hang up on us — the same kind of
		// error, which must not count as the database's either.
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("HTTP %s: %v, want a refused connection, an EOF or a reset", name, err)
		}
		if database.IsUnavailable(fmt.Errorf("labs: %w", err)) {
			t.Errorf("HTTP %s (%v) classified as the database's", name, err)
		}
	}

	// The database killed under an open connection, and then away.
	c := pgcluster.ForTest(t, pgcluster.Options{})
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `SELECT 1`)
	if err == nil || !database.IsUnavailable(fmt.Errorf("users: %w", err)) {
		t.Errorf("a query on a connection whose server died: %v, want unavailable", err)
	}
	_, err = pgx.Connect(ctx, c.URL())
	if err == nil || !database.IsUnavailable(err) {
		t.Errorf("connecting to a stopped server: %v, want unavailable", err)
	}
}

// A process started while its database is down waits and comes up when the
// database does: WaitFor retries while the error says "unavailable".
func TestWaitForAStoppedDatabase(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(time.Second)
		if err := c.Start(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attempts := 0
	pool, err := database.WaitFor(ctx, slog.New(slog.DiscardHandler), "test", func(ctx context.Context) (any, error) {
		attempts++
		p, err := database.Open(ctx, c.URL(), 2)
		if err != nil {
			return nil, err
		}
		p.Close()
		return p, nil
	})
	if err != nil || pool == nil || attempts < 2 {
		t.Fatalf("WaitFor = %v, %v after %d attempts; want success after waiting", pool, err, attempts)
	}
	// A reason other than "unavailable" is returned at once.
	attempts = 0
	_, err = database.WaitFor(ctx, slog.New(slog.DiscardHandler), "test", func(context.Context) (any, error) {
		attempts++
		return nil, errors.New("migration 7 is broken")
	})
	if err == nil || attempts != 1 {
		t.Errorf("a lasting error: %v after %d attempts, want it at once", err, attempts)
	}
}
