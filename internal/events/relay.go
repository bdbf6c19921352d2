package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/crash"
)

// A Publisher hands events to a broker and reports, for each, what the
// broker said once it acknowledged — or the error. Publish returns one
// result per message, in order.
type Publisher interface {
	Transport() string
	Publish(ctx context.Context, ms []Message) []PublishResult
	// DuplicateWindow is how long the broker remembers an event id and
	// drops a repeat; 0 when it does not dedupe at all.
	DuplicateWindow() time.Duration
}

// PublishResult is the broker's answer for one message.
type PublishResult struct {
	// Duplicate: the broker already had this event id inside its dedupe
	// window and did not store the copy.
	Duplicate bool
	Err       error
}

// RelayConfig configures a Relay. Zero fields take the defaults.
type RelayConfig struct {
	// Instance names this process in the publishes log.
	Instance string
	// Interval between polls. Polling is the guarantee; a NOTIFY from
	// Write only wakes the relay sooner. Default 1s.
	Interval time.Duration
	// AwakeFor is how long a relay stays awake after a NOTIFY or a pass
	// that found rows, polling every AwakeInterval: the writers of one
	// process notify once per 100 ms at most (wakeEvery), and the events
	// they write meanwhile are found by these polls. Defaults 1s and 10ms.
	AwakeFor, AwakeInterval time.Duration
	// Batch is how many rows one claim takes. Default 100.
	Batch int
	// Lease is how long a claim keeps other relays off its rows: longer
	// than a publish can take. Default 30s.
	Lease time.Duration
	// MaxAttempts failed publishes make a row DEAD. Default 10.
	MaxAttempts int
	// Backoff is the wait after the first failed publish, doubling, at
	// most MaxBackoff. Defaults 500ms and 30s.
	Backoff, MaxBackoff time.Duration
	// Retention is how long SENT rows (and the publishes and deliveries
	// logs) are kept before the relay deletes them. Default 24h.
	Retention time.Duration
	// InboxRetention is how long inbox rows are kept: longer than any
	// transport can redeliver. Default 30 days.
	InboxRetention time.Duration
	// PurgeBatch bounds one DELETE. Default 1000.
	PurgeBatch int
	// Listen is where the relay's LISTEN runs: the database itself when
	// the relay's pool goes through a pooler in transaction mode
	// (PgBouncer), which hands a session's server connection to others
	// between transactions, so a NOTIFY would never reach it. Default: the
	// relay's pool.
	Listen   *pgxpool.Pool
	Crash    *crash.Switch
	Injector *Injector
	Metrics  *Metrics
	Logger   *slog.Logger
}

func (c RelayConfig) withDefaults() RelayConfig {
	c.Interval = cmp.Or(c.Interval, time.Second)
	c.AwakeFor = cmp.Or(c.AwakeFor, time.Second)
	c.AwakeInterval = cmp.Or(c.AwakeInterval, 10*time.Millisecond)
	c.Batch = cmp.Or(c.Batch, 100)
	c.Lease = cmp.Or(c.Lease, 30*time.Second)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, 10)
	c.Backoff = cmp.Or(c.Backoff, 500*time.Millisecond)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, 30*time.Second)
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.InboxRetention = cmp.Or(c.InboxRetention, 30*24*time.Hour)
	c.PurgeBatch = cmp.Or(c.PurgeBatch, 1000)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RelayConfig) validate() error {
	switch {
	case c.Interval < 0 || c.AwakeFor < 0 || c.AwakeInterval < 0 || c.Lease < 0 || c.Backoff < 0 || c.MaxBackoff < 0 || c.Retention < 0 || c.InboxRetention < 0:
		return errors.New("events: relay durations must not be negative")
	case c.Batch < 0 || c.MaxAttempts < 0 || c.PurgeBatch < 0:
		return errors.New("events: relay counts must not be negative")
	}
	return nil
}

// Relay moves PENDING outbox rows of one transport to its broker:
//
//	tx:    claim due rows (FOR UPDATE SKIP LOCKED), lease them, commit
//	       ── no transaction open ──
//	call:  publish each with its event id; wait for the broker's acks
//	       ── no transaction open ──
//	tx:    acked → SENT; failed → PENDING with backoff, or DEAD; fenced
//	       by the claim token, with the publishes log
//
// A crash after the acks and before the mark leaves the rows PENDING; when
// their lease runs out a relay publishes them again. That is the contract:
// at least once, never "at most once by luck".
type Relay struct {
	pool *pgxpool.Pool
	pub  Publisher
	cfg  RelayConfig

	republish sync.WaitGroup // the injector's after_window copies in flight
}

// NewRelay returns a relay from pool's outbox to pub.
func NewRelay(pool *pgxpool.Pool, pub Publisher, cfg RelayConfig) (*Relay, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == nil {
		cfg.Listen = pool
	}
	return &Relay{pool: pool, pub: pub, cfg: cfg.withDefaults()}, nil
}

// RelayCounts is what one pass did.
type RelayCounts struct {
	Claimed, Published, Duplicates, Failed, Dead, Fenced int
}

// Run relays until ctx is done: a pass at every tick, at once when a
// writer's NOTIFY arrives, and every AwakeInterval for AwakeFor after a
// NOTIFY or a pass that found rows (writers notify once per wakeEvery, not
// once per event). A failed pass is logged and retried at the next tick.
func (r *Relay) Run(ctx context.Context) {
	wake := make(chan struct{}, 1)
	listening := make(chan struct{})
	go r.listen(ctx, wake, listening)
	// A NOTIFY sent before LISTEN took effect is lost: the first pass runs
	// once the listener is in place (or after one interval without it), so
	// it sees every row whose wake-up was missed.
	select {
	case <-listening:
	case <-time.After(r.cfg.Interval):
	case <-ctx.Done():
		return
	}
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	poll := time.NewTimer(r.cfg.AwakeInterval)
	defer poll.Stop()
	lastPurge, awakeUntil := time.Time{}, time.Now().Add(r.cfg.AwakeFor)
	for {
		counts, err := r.runOnce(ctx)
		if counts.Claimed > 0 {
			awakeUntil = time.Now().Add(r.cfg.AwakeFor)
		}
		if err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("events: relay pass failed", "transport", r.pub.Transport(), "err", err)
		} else if counts.Dead > 0 {
			r.cfg.Logger.Warn("events: outbox rows dead-lettered", "transport", r.pub.Transport(), "dead", counts.Dead)
		}
		if time.Since(lastPurge) > time.Minute {
			lastPurge = time.Now()
			if n, err := r.purge(ctx, nil); err != nil && ctx.Err() == nil {
				r.cfg.Logger.Error("events: purge failed", "err", err)
			} else if n > 0 {
				r.cfg.Logger.Info("events: purged old rows", "rows", n)
			}
		}
		var awake <-chan time.Time
		if time.Now().Before(awakeUntil) {
			poll.Reset(r.cfg.AwakeInterval)
			awake = poll.C
		}
		select {
		case <-ctx.Done():
			r.republish.Wait()
			return
		case <-ticker.C:
		case <-awake:
		case <-wake:
			awakeUntil = time.Now().Add(r.cfg.AwakeFor)
		}
	}
}

// listen turns the writers' NOTIFYs into wake-ups, reconnecting after a
// failure. Losing it costs latency only: the ticker still polls.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}, listening chan<- struct{}) {
	var once sync.Once
	ready := func() { once.Do(func() { close(listening) }) }
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, wake, ready)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Warn("events: relay lost LISTEN; polling meanwhile", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Interval):
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, wake chan<- struct{}, ready func()) error {
	conn, err := r.cfg.Listen.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN idemlab_outbox`); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), `UNLISTEN idemlab_outbox`)
	ready()
	// A reconnected listener may have missed wake-ups: wake a pass now.
	select {
	case wake <- struct{}{}:
	default:
	}
	for {
		n, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload != r.pub.Transport() {
			continue
		}
		select {
		case wake <- struct{}{}:
		default: // a pass is due already
		}
	}
}

// runOnce relays batch after batch until a batch comes back short.
func (r *Relay) runOnce(ctx context.Context) (RelayCounts, error) {
	var total RelayCounts
	for ctx.Err() == nil {
		c, err := r.relayBatch(ctx)
		total.Claimed += c.Claimed
		total.Published += c.Published
		total.Duplicates += c.Duplicates
		total.Failed += c.Failed
		total.Dead += c.Dead
		total.Fenced += c.Fenced
		if err != nil || c.Claimed < r.cfg.Batch {
			if err == nil {
				err = r.observe(ctx)
			}
			return total, err
		}
	}
	return total, ctx.Err()
}

const sqlClaim = `
UPDATE outbox o
   SET next_attempt_at = now() + make_interval(secs => $3), -- the lease: other relays skip these rows meanwhile
       claim_token = $4
  FROM (SELECT id
          FROM outbox
         WHERE transport = $1
           AND status = 'PENDING'
           AND next_attempt_at <= now()
         ORDER BY next_attempt_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED -- rows another relay is claiming right now are skipped, not waited for
       ) due
 WHERE o.id = due.id
RETURNING o.id, o.type, o.key, o.payload, o.created_at, o.seq, coalesce(o.traceparent, '')`

const sqlMarkSent = `
UPDATE outbox
   SET status = 'SENT',
       sent_at = clock_timestamp(),
       attempts = attempts + 1,
       claim_token = NULL,
       last_error = NULL
 WHERE id = ANY($1)
   AND claim_token = $2 -- the fence: 0 rows when our lease ran out and another relay claimed them
   AND status = 'PENDING'`

const sqlMarkFailed = `
UPDATE outbox
   SET attempts = attempts + 1,
       last_error = $3,
       claim_token = NULL,
       -- max attempts reached: a person decides (replay from the Events page)
       status = CASE WHEN attempts + 1 >= $4 THEN 'DEAD' ELSE 'PENDING' END,
       next_attempt_at = now() + least(make_interval(secs => $5 * 2 ^ attempts), make_interval(secs => $6))
 WHERE id = $1
   AND claim_token = $2 -- the fence
   AND status = 'PENDING'
RETURNING status`

const sqlLogPublishes = `
INSERT INTO event_publishes (event_id, transport, instance, duplicate, injected)
SELECT unnest($1::uuid[]), $2, $3, unnest($4::boolean[]), unnest($5::text[])`

// relayBatch claims, publishes and marks one batch.
func (r *Relay) relayBatch(ctx context.Context) (RelayCounts, error) {
	var c RelayCounts
	token := uuid.New()
	rows, err := r.pool.Query(ctx, sqlClaim, r.pub.Transport(), r.cfg.Batch, r.cfg.Lease.Seconds(), token)
	if err != nil {
		return c, fmt.Errorf("events: claim: %w", err)
	}
	ms, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Message])
	if err != nil {
		return c, fmt.Errorf("events: claim: %w", err)
	}
	c.Claimed = len(ms)
	if len(ms) == 0 {
		return c, nil
	}

	// The injector's relay-side modes, one take per message.
	injected := make([]Mode, len(ms))
	send := ms
	for i := range ms {
		mode, err := r.cfg.Injector.take(ctx, "", DeliverTwice, AfterWindow)
		if err != nil {
			return c, err
		}
		injected[i] = mode
		if mode == DeliverTwice {
			send = append(send[:len(send):len(send)], ms[i])
		}
	}

	// ── no transaction open: the broker is another system ──
	results := r.pub.Publish(ctx, send)
	r.cfg.Crash.At(ctx, CrashRelayAfterPublishBeforeMark)

	var sent []uuid.UUID
	var log struct {
		ids      []uuid.UUID
		dup      []bool
		injected []*string
	}
	failed := map[int]error{}
	for i, res := range results {
		orig := i
		var why *string
		if i >= len(ms) { // an injected second copy of one of ms
			orig = indexOf(ms, send[i].ID)
			why = new(string(DeliverTwice))
		} else if injected[i] == AfterWindow {
			why = new(string(AfterWindow) + " (first copy)")
		}
		if res.Err != nil {
			if i < len(ms) {
				failed[orig] = res.Err
			}
			continue
		}
		if i < len(ms) {
			sent = append(sent, ms[i].ID)
		}
		log.ids = append(log.ids, send[i].ID)
		log.dup = append(log.dup, res.Duplicate)
		log.injected = append(log.injected, why)
		if res.Duplicate {
			c.Duplicates++
			r.cfg.Metrics.brokerDuplicate(r.pub.Transport())
		}
	}

	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlMarkSent, sent, token)
		if err != nil {
			return fmt.Errorf("mark sent: %w", err)
		}
		c.Published = int(tag.RowsAffected())
		c.Fenced = len(sent) - c.Published
		for i, cause := range failed {
			var status string
			err := tx.QueryRow(ctx, sqlMarkFailed, ms[i].ID, token, cause.Error(), r.cfg.MaxAttempts,
				r.cfg.Backoff.Seconds(), r.cfg.MaxBackoff.Seconds()).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				c.Fenced++
				continue
			}
			if err != nil {
				return fmt.Errorf("mark failed: %w", err)
			}
			c.Failed++
			if status == "DEAD" {
				c.Dead++
			}
		}
		if len(log.ids) > 0 {
			_, err = tx.Exec(ctx, sqlLogPublishes, log.ids, r.pub.Transport(), r.cfg.Instance, log.dup, log.injected)
		}
		return err
	})
	if err != nil {
		return c, fmt.Errorf("events: after publish: %w", err)
	}
	r.cfg.Metrics.published(r.pub.Transport(), "acked", len(log.ids)-c.Duplicates)
	r.cfg.Metrics.published(r.pub.Transport(), "duplicate", c.Duplicates)
	r.cfg.Metrics.published(r.pub.Transport(), "failed", len(failed))
	r.cfg.Metrics.dead(r.pub.Transport(), c.Dead)

	for i, mode := range injected {
		if mode == AfterWindow && failed[i] == nil {
			r.publishAgainAfterWindow(ctx, ms[i])
		}
	}
	for _, cause := range failed { // the rows are back to PENDING with backoff; say why
		return c, fmt.Errorf("events: %d of %d publishes failed: %w", len(failed), len(ms), cause)
	}
	return c, nil
}

// publishAgainAfterWindow publishes m once more when the broker's dedupe
// window has passed (the injector's after_window). The copy is kept in
// memory only: it is a lab's second delivery, not part of the guarantee.
func (r *Relay) publishAgainAfterWindow(ctx context.Context, m Message) {
	wait := r.pub.DuplicateWindow() + time.Second
	r.republish.Add(1)
	go func() {
		defer r.republish.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		res := r.pub.Publish(ctx, []Message{m})[0]
		if res.Err != nil {
			r.cfg.Logger.Warn("events: after_window copy not published", "event", m.ID, "err", res.Err)
			return
		}
		if res.Duplicate {
			r.cfg.Metrics.brokerDuplicate(r.pub.Transport())
		}
		r.cfg.Metrics.published(r.pub.Transport(), map[bool]string{true: "duplicate", false: "acked"}[res.Duplicate], 1)
		_, err := r.pool.Exec(context.WithoutCancel(ctx), sqlLogPublishes, []uuid.UUID{m.ID}, r.pub.Transport(),
			r.cfg.Instance, []bool{res.Duplicate}, []*string{new(string(AfterWindow))})
		if err != nil {
			r.cfg.Logger.Warn("events: could not log a publish", "event", m.ID, "err", err)
		}
	}()
}

// WaitRepublished waits for the injector's after_window copies in flight.
func (r *Relay) WaitRepublished() { r.republish.Wait() }

func indexOf(ms []Message, id uuid.UUID) int {
	for i, m := range ms {
		if m.ID == id {
			return i
		}
	}
	return -1
}

// observe sets the lag and backlog gauges: the age of the oldest PENDING
// row of this transport (due or not), and how many there are.
func (r *Relay) observe(ctx context.Context) error {
	if r.cfg.Metrics == nil {
		return nil
	}
	var pending int64
	var lag float64
	err := r.pool.QueryRow(ctx, `
		SELECT count(*),
		       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)
		  FROM outbox
		 WHERE transport = $1
		   AND status = 'PENDING'`, r.pub.Transport()).Scan(&pending, &lag)
	if err != nil {
		return fmt.Errorf("events: observe: %w", err)
	}
	r.cfg.Metrics.backlog(r.pub.Transport(), pending, lag)
	return nil
}

// purge deletes, in bounded batches, SENT rows past Retention, the logs
// past Retention and inbox rows past InboxRetention. at overrides the
// database clock (tests move time instead of sleeping).
func (r *Relay) purge(ctx context.Context, at *time.Time) (int, error) {
	total := 0
	for _, q := range []struct {
		sql  string
		keep time.Duration
	}{
		{`DELETE FROM outbox
		   WHERE id IN (SELECT id
		                  FROM outbox
		                 WHERE status = 'SENT'
		                   AND sent_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
		                 ORDER BY sent_at
		                 LIMIT $3
		                   FOR UPDATE SKIP LOCKED)`, r.cfg.Retention},
		{`DELETE FROM event_publishes
		   WHERE id IN (SELECT id FROM event_publishes
		                 WHERE at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
		                 ORDER BY at LIMIT $3)`, r.cfg.Retention},
		{`DELETE FROM event_deliveries
		   WHERE id IN (SELECT id FROM event_deliveries
		                 WHERE at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
		                 ORDER BY at LIMIT $3)`, r.cfg.Retention},
		{`DELETE FROM inbox
		   WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM inbox
		                 WHERE applied_at < coalesce($1::timestamptz, now()) - make_interval(secs => $2)
		                 ORDER BY applied_at LIMIT $3)`, r.cfg.InboxRetention},
	} {
		for ctx.Err() == nil {
			tag, err := r.pool.Exec(ctx, q.sql, at, q.keep.Seconds(), r.cfg.PurgeBatch)
			if err != nil {
				return total, fmt.Errorf("events: purge: %w", err)
			}
			total += int(tag.RowsAffected())
			if tag.RowsAffected() < int64(r.cfg.PurgeBatch) {
				break
			}
		}
	}
	return total, nil
}
