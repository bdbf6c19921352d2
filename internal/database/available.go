package database

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrUnavailable marks an error that says "the database is not there right
// now" — down, restarting, in crash recovery, out of connections — rather
// than "this statement is wrong". Nothing of a transaction that failed this
// way was committed, so the request may simply be sent again later: the
// HTTP layer answers 503 database-unavailable with Retry-After, never 500.
var ErrUnavailable = errors.New("database: unavailable")

// IsUnavailable reports whether err means the database could not be reached
// or dropped the connection, as opposed to refusing a statement.
//
// A refused connection or an EOF is classified by where it came from. pgx
// hands a dead socket's error back as it is (a *net.OpError, io.EOF), so
// those count as the database's — unless they happened inside an HTTP call:
// net/http's client wraps every error it returns in a *url.Error, and a
// provider or payments service that is away is theirs. Answering it
// "database unavailable" would send an operator to the wrong machine.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var (
		connect *pgconn.ConnectError
		pgErr   *pgconn.PgError
		call    *url.Error
	)
	switch {
	case errors.Is(err, ErrUnavailable),
		errors.As(err, &connect),             // could not connect at all
		errors.Is(err, pgconn.ErrConnClosed): // the connection died under us
		return true
	case errors.As(err, &pgErr):
		switch pgErr.Code {
		case "57P01", // admin_shutdown: the server is stopping
			"57P02", // crash_shutdown
			"57P03", // cannot_connect_now: starting up, in recovery
			"53300": // too_many_connections
			return true
		}
		return len(pgErr.Code) == 5 && pgErr.Code[:2] == "08" // connection exceptions
	case errors.As(err, &call):
		return false // an HTTP call's network failure: the called service's
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || // dropped mid-answer
		errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE)
}

// WaitFor calls open until it succeeds or fails for a reason other than an
// unavailable database, waiting between attempts with a doubling backoff
// (250 ms up to 5 s) and logging each wait. A process started while its
// database is down, restarting or in crash recovery waits for it instead of
// exiting; ctx ending stops the wait.
func WaitFor[T any](ctx context.Context, logger *slog.Logger, what string, open func(context.Context) (T, error)) (T, error) {
	wait := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := open(ctx)
		if err == nil || !IsUnavailable(err) || ctx.Err() != nil {
			return v, err
		}
		logger.Warn("waiting for the database", "what", what, "attempt", attempt, "retry_in", wait, "err", err)
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
