package database_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

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
		{fmt.Errorf("users: %w", io.ErrUnexpectedEOF), true},  // dropped mid-answer
		{fmt.Errorf("slots: %w", pgconn.ErrConnClosed), true}, // dead connection
		{&pgconn.PgError{Code: "23505"}, false},               // a refused statement
		{&pgconn.PgError{Code: "55P03"}, false},               // a lock wait: not an outage
		{context.DeadlineExceeded, false},                     // someone's timeout
		{errors.New("policies: operation not found"), false},  // a domain error
		{fmt.Errorf("x: %w", database.ErrUnavailable), true},  // marked by hand
		{nil, false},
	} {
		if got := database.IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
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
