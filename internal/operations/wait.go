package operations

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
)

// FinalChannel is the channel the operations_notify_final trigger notifies,
// with the operation's id as payload, in the transaction that makes an
// operation SUCCEEDED, FAILED or NEEDS_RECONCILIATION (migration 00131).
// The notification is delivered when — and only if — that transaction
// commits.
const FinalChannel = "operation_final"

// MaxWait is the longest a request may wait for an outcome (Prefer: wait=N).
const MaxWait = 30 * time.Second

// Waiter lets requests wait for operations to become final without polling:
// one connection per process LISTENs on FinalChannel, and each notification
// wakes only the requests waiting on that operation. A wait reads the
// operation's status once when it starts and once each time it is woken,
// never on a timer.
type Waiter struct {
	pool     *pgxpool.Pool
	listenTo *pgx.ConnConfig
	logger   *slog.Logger

	mu      sync.Mutex
	waiting map[int64]map[chan struct{}]struct{}
	closed  bool
}

// NewWaiter returns a Waiter that reads statuses over pool and, once Run is
// started, listens on a connection of its own made with listen: the
// database itself, not a pooler in transaction mode, which would hand the
// LISTEN's session to someone else (DATABASE_DIRECT_URL).
func NewWaiter(pool *pgxpool.Pool, listen *pgx.ConnConfig, logger *slog.Logger) *Waiter {
	return &Waiter{pool: pool, listenTo: listen, logger: logger, waiting: map[int64]map[chan struct{}]struct{}{}}
}

// Run holds the LISTEN connection until ctx is done, reconnecting after a
// second when it breaks. Each (re)connection wakes every waiter, since a
// notification sent while nobody listened is lost; when Run returns, every
// wait returns at once (the server is shutting down).
func (w *Waiter) Run(ctx context.Context) {
	defer w.close()
	for ctx.Err() == nil {
		if err := w.listen(ctx); err != nil && ctx.Err() == nil {
			w.logger.Warn("operations: LISTEN connection lost; reconnecting", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (w *Waiter) listen(ctx context.Context) error {
	// Its own connection, outside the pool: it is held for the process's life.
	conn, err := pgx.ConnectConfig(ctx, w.listenTo.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+FinalChannel); err != nil {
		return err
	}
	w.wakeAll() // whatever finished while nobody listened
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if id, err := strconv.ParseInt(n.Payload, 10, 64); err == nil {
			w.wake(id)
		}
	}
}

// Wait blocks until operation id is final, d has passed or ctx is done, and
// returns its status then. d is capped at MaxWait.
func (w *Waiter) Wait(ctx context.Context, id int64, d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, min(d, MaxWait))
	defer cancel()
	for {
		// Register before reading, so a notification sent between the read
		// and the wait is not missed.
		woken, ok := w.register(id)
		status, err := w.status(ctx, id)
		if err != nil || final(status) || !ok {
			w.unregister(id, woken)
			return status, err
		}
		select {
		case <-woken:
		case <-ctx.Done():
			w.unregister(id, woken)
			// out of time: the status as it is now, read without ctx
			return w.status(context.WithoutCancel(ctx), id)
		}
	}
}

// final: nothing more will happen to the operation on its own.
func final(status string) bool {
	return status == "SUCCEEDED" || status == "FAILED" || status == "NEEDS_RECONCILIATION"
}

// ErrNotFound: no operation with that id (it may have been purged).
var ErrNotFound = errors.New("operations: no such operation")

func (w *Waiter) status(ctx context.Context, id int64) (string, error) {
	return Status(ctx, w.pool, id)
}

// Status is operation id's status now; ErrNotFound when there is none.
func Status(ctx context.Context, db database.DBTX, id int64) (string, error) {
	var status string
	err := db.QueryRow(ctx, `SELECT status FROM operations WHERE id = $1`, id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("operations: status of %d: %w", id, err)
	}
	return status, nil
}

// register adds a channel that is closed when id is notified (or on a
// reconnection); ok is false once the Waiter has stopped.
func (w *Waiter) register(id int64) (chan struct{}, bool) {
	ch := make(chan struct{})
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ch, false
	}
	if w.waiting[id] == nil {
		w.waiting[id] = map[chan struct{}]struct{}{}
	}
	w.waiting[id][ch] = struct{}{}
	return ch, true
}

func (w *Waiter) unregister(id int64, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if set := w.waiting[id]; set != nil {
		delete(set, ch)
		if len(set) == 0 {
			delete(w.waiting, id)
		}
	}
}

// wake closes every channel waiting on id; each waiter reads the status
// again and registers anew if it must go on waiting.
func (w *Waiter) wake(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiting[id] {
		close(ch)
	}
	delete(w.waiting, id)
}

func (w *Waiter) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, set := range w.waiting {
		for ch := range set {
			close(ch)
		}
	}
	clear(w.waiting)
}

func (w *Waiter) close() {
	w.wakeAll()
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
