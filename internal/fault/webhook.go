package fault

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/webhook"
)

// A fake calls its caller back when a call reaches a state — RUNNING,
// COMPLETED, REJECTED — as payment processors and insurers do: the callback
// is queued in the fake's own webhook outbox in the transaction that
// processed the call (Process calls Keyed.Notify), and the fake's Sender
// pushes it after commit, signed (internal/webhook), at least once, with
// backoff. How callbacks misbehave is a setting of its own, fake-wide:
//
//	mode       what the caller receives
//	off        nothing (the default)
//	ok         each event once (more often if a push fails: at least once)
//	duplicate  each event twice, the same event id in both copies
//	delay      each event delay_ms late: after a status query was answered
//	reorder    a RUNNING also for calls that complete at once, sent delay_ms
//	           after the COMPLETED that followed it: COMPLETED, then RUNNING
//	lost       nothing: the events are recorded (the ledger shows them), never sent

// WebhookMode is how a fake sends its callbacks.
type WebhookMode string

// The webhook modes.
const (
	WebhooksOff       WebhookMode = "off"
	WebhooksOK        WebhookMode = "ok"
	WebhooksDuplicate WebhookMode = "duplicate"
	WebhooksDelay     WebhookMode = "delay"
	WebhooksReorder   WebhookMode = "reorder"
	WebhooksLost      WebhookMode = "lost"
)

// WebhookSettings is a fake's callback setting, the JSON of GET and PUT
// /v1/webhooks: {"mode":"reorder","delay_ms":2000}.
type WebhookSettings struct {
	Mode    WebhookMode `json:"mode"`
	DelayMS int         `json:"delay_ms"`
}

// DefaultWebhookSettings: no callbacks.
func DefaultWebhookSettings() WebhookSettings {
	return WebhookSettings{Mode: WebhooksOff, DelayMS: 2000}
}

func (w WebhookSettings) validate() error {
	switch w.Mode {
	case WebhooksOff, WebhooksOK, WebhooksDuplicate, WebhooksDelay, WebhooksReorder, WebhooksLost:
	default:
		return &InvalidError{Field: "mode", Message: fmt.Sprintf("mode %q (want off, ok, duplicate, delay, reorder or lost)", w.Mode)}
	}
	if w.DelayMS < 0 || w.DelayMS > MaxSlowMS {
		return &InvalidError{Field: "delay_ms", Message: fmt.Sprintf("delay_ms %d is out of range (0 to %d)", w.DelayMS, MaxSlowMS)}
	}
	return nil
}

// WebhookSettings returns the fake's callback setting.
func (s *Store) WebhookSettings(ctx context.Context) (WebhookSettings, error) {
	w := DefaultWebhookSettings()
	err := s.pool.QueryRow(ctx, `
		SELECT mode, delay_ms
		  FROM fault.webhook_settings
		 WHERE system = $1`, s.system).Scan(&w.Mode, &w.DelayMS)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return WebhookSettings{}, fmt.Errorf("fault: %s webhook settings: %w", s.system, err)
	}
	return w, nil
}

// SetWebhookSettings replaces the fake's callback setting. An invalid one
// is an *InvalidError naming the field.
func (s *Store) SetWebhookSettings(ctx context.Context, w WebhookSettings) (WebhookSettings, error) {
	if err := w.validate(); err != nil {
		return WebhookSettings{}, err
	}
	_, err := s.pool.Exec(ctx, `
		INSERT INTO fault.webhook_settings (system, mode, delay_ms)
		VALUES ($1, $2, $3)
		ON CONFLICT (system) DO UPDATE
		   SET mode = excluded.mode,
		       delay_ms = excluded.delay_ms,
		       updated_at = now()`, s.system, w.Mode, w.DelayMS)
	if err != nil {
		return WebhookSettings{}, fmt.Errorf("fault: %s set webhook settings: %w", s.system, err)
	}
	return w, nil
}

// Outbox is one fake's webhook outbox (fake_provider.webhooks,
// fake_payments.webhooks).
type Outbox struct {
	system string
	name   string // sanitized, schema-qualified
}

// NewOutbox names schema.webhooks, the outbox of system.
func NewOutbox(schema, system string) Outbox {
	return Outbox{system: system, name: pgx.Identifier{schema, "webhooks"}.Sanitize()}
}

// Forget is the statement that empties the outbox on a reset.
func (o Outbox) Forget() string { return `DELETE FROM ` + o.name }

// Notify queues, in tx, the callbacks of what key's record in records says
// now, as the webhook setting shapes them (none when off). Called by the
// transaction that recorded the outcome, so a callback exists exactly when
// its outcome does. The event id is derived from the record (its key, the
// state, when it was first received), so a non-idempotent repeat that is
// accepted again reports the same events under the same ids.
func (o Outbox) Notify(ctx context.Context, tx pgx.Tx, records Table, key string) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO `+o.name+` (event_id, idempotency_key, status, reason, occurred_at, deliver_after, lost)
		SELECT 'evt_' || md5($2 || ':' || r.idempotency_key || ':' || e.status || ':' || r.received_at::text),
		       r.idempotency_key, e.status, e.reason, e.occurred_at,
		       e.due + CASE WHEN s.mode IN ('delay', 'reorder') AND e.late THEN make_interval(secs => s.delay_ms / 1000.0)
		                    ELSE interval '0' END,
		       s.mode = 'lost'
		  FROM `+records.name+` r
		  JOIN fault.webhook_settings s
		    ON s.system = $2
		   AND s.mode <> 'off'
		 CROSS JOIN LATERAL (VALUES
		       -- a refusal, now
		       ('REJECTED', r.reject_reason, now(), now(), s.mode = 'delay', r.outcome = 'REJECTED'),
		       -- accepted, completing later: RUNNING now (reorder: a RUNNING for every
		       -- acceptance, sent delay_ms after the COMPLETED)
		       ('RUNNING', NULL, now(), CASE WHEN s.mode = 'reorder' THEN greatest(r.completes_at, now()) ELSE now() END,
		        s.mode IN ('delay', 'reorder'), r.outcome = 'ACCEPTED' AND (r.completes_at > now() OR s.mode = 'reorder')),
		       -- accepted: COMPLETED when it completes
		       ('COMPLETED', NULL, greatest(r.completes_at, now()), greatest(r.completes_at, now()), s.mode = 'delay',
		        r.outcome = 'ACCEPTED')
		       ) AS e(status, reason, occurred_at, due, late, wanted)
		 CROSS JOIN generate_series(1, CASE WHEN s.mode = 'duplicate' THEN 2 ELSE 1 END) AS copy
		 WHERE r.idempotency_key = $1
		   AND e.wanted`, key, o.system)
	if err != nil {
		return fmt.Errorf("fault: %s queue callbacks of %s: %w", o.system, key, err)
	}
	return nil
}

// WebhookCopy is one row of the outbox, as the ledger shows it.
type WebhookCopy struct {
	ID           int64      `json:"id"`
	EventID      string     `json:"event_id"`
	Key          string     `json:"key"`
	Status       string     `json:"status"`
	OccurredAt   time.Time  `json:"occurred_at"`
	DeliverAfter time.Time  `json:"deliver_after"`
	Lost         bool       `json:"lost"`
	Attempts     int        `json:"attempts"`
	DeliveredAt  *time.Time `json:"delivered_at"`
	LastStatus   *int       `json:"last_status"`
	LastError    *string    `json:"last_error"`
}

// WebhookLedger is the JSON of GET /v1/webhooks: the setting, the totals
// and the latest copies.
type WebhookLedger struct {
	Settings  WebhookSettings `json:"settings"`
	Queued    int64           `json:"queued"`    // not yet delivered, not lost
	Delivered int64           `json:"delivered"` // answered 2xx
	Lost      int64           `json:"lost"`      // recorded, never sent
	Retries   int64           `json:"retries"`   // pushes beyond the first, over all copies
	Recent    []WebhookCopy   `json:"recent"`
}

// Ledger reads the outbox: totals and the latest limit copies.
func (o Outbox) Ledger(ctx context.Context, pool *pgxpool.Pool, store *Store, limit int) (WebhookLedger, error) {
	var l WebhookLedger
	var err error
	if l.Settings, err = store.WebhookSettings(ctx); err != nil {
		return l, err
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE delivered_at IS NULL AND NOT lost),
		       count(*) FILTER (WHERE delivered_at IS NOT NULL),
		       count(*) FILTER (WHERE lost),
		       coalesce(sum(greatest(attempts - 1, 0)), 0)
		  FROM `+o.name).Scan(&l.Queued, &l.Delivered, &l.Lost, &l.Retries)
	if err != nil {
		return l, fmt.Errorf("fault: %s webhook ledger: %w", o.system, err)
	}
	rows, err := pool.Query(ctx, `
		SELECT id, event_id, idempotency_key, status, occurred_at, deliver_after, lost, attempts,
		       delivered_at, last_status, last_error
		  FROM `+o.name+`
		 ORDER BY id DESC
		 LIMIT $1`, limit)
	if err != nil {
		return l, fmt.Errorf("fault: %s webhook ledger: %w", o.system, err)
	}
	l.Recent, err = pgx.CollectRows(rows, pgx.RowToStructByPos[WebhookCopy])
	if err != nil {
		return l, fmt.Errorf("fault: %s webhook ledger: %w", o.system, err)
	}
	return l, nil
}

// SenderConfig is what a Sender needs besides the outbox.
type SenderConfig struct {
	// URL receives the callbacks: the app's POST /webhooks/{system}.
	URL string
	// Secret signs them (WEBHOOK_SECRET); the app checks with the same.
	Secret []byte
	// Interval between passes; default 100 ms.
	Interval time.Duration
	// Timeout of one push; default 10 s. A push not answered 2xx in time is
	// pushed again after a backoff that doubles from MinBackoff to MaxBackoff.
	Timeout, MinBackoff, MaxBackoff time.Duration
	// Batch is how many due copies one pass claims; default 50.
	Batch  int
	Client *http.Client
	Logger *slog.Logger
}

// Sender pushes a fake's queued callbacks.
type Sender struct {
	pool   *pgxpool.Pool
	outbox Outbox
	cfg    SenderConfig
}

// NewSender returns the sender of outbox on pool.
func NewSender(pool *pgxpool.Pool, outbox Outbox, cfg SenderConfig) *Sender {
	cfg.Interval = cmp.Or(cfg.Interval, 100*time.Millisecond)
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, 500*time.Millisecond)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, time.Minute)
	if cfg.Batch <= 0 {
		cfg.Batch = 50
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sender{pool: pool, outbox: outbox, cfg: cfg}
}

// Run pushes due callbacks until ctx is done.
func (s *Sender) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := s.RunOnce(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Error("fault: push callbacks", "system", s.outbox.system, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SendCounts is what one pass did.
type SendCounts struct{ Claimed, Delivered, Retried, Fenced int }

// RunOnce claims the due copies and pushes them one after the other, in the
// order they fell due (so a reordered RUNNING does arrive after its
// COMPLETED). Each copy is leased by the claim for the push's timeout, so
// no transaction spans a push and another sender skips it meanwhile.
func (s *Sender) RunOnce(ctx context.Context) (SendCounts, error) {
	var n SendCounts
	token := uuid.New()
	rows, err := s.pool.Query(ctx, `
		WITH due AS (
		    SELECT id, deliver_after
		      FROM `+s.outbox.name+`
		     WHERE delivered_at IS NULL
		       AND NOT lost
		       AND deliver_after <= now()
		     ORDER BY deliver_after, id
		     LIMIT $1
		       FOR UPDATE SKIP LOCKED -- copies another sender is claiming are skipped, not waited for
		), claimed AS (
		    UPDATE `+s.outbox.name+` w
		       SET deliver_after = now() + make_interval(secs => $2), -- the lease: other senders skip it meanwhile
		           lease_token = $3,
		           attempts = w.attempts + 1
		      FROM due
		     WHERE w.id = due.id
		    RETURNING w.id, w.event_id, w.idempotency_key, w.status, coalesce(w.reason, '') AS reason, w.occurred_at,
		              w.attempts, due.deliver_after AS due_at
		)
		SELECT id, event_id, idempotency_key, status, reason, occurred_at, attempts
		  FROM claimed
		 ORDER BY due_at, id`, s.cfg.Batch, 2*s.cfg.Timeout.Seconds(), token)
	if err != nil {
		return n, fmt.Errorf("fault: claim callbacks: %w", err)
	}
	type claimed struct {
		id int64
		ev webhook.Event
	}
	var batch []claimed
	var c claimed
	_, err = pgx.ForEachRow(rows, []any{&c.id, &c.ev.ID, &c.ev.Key, &c.ev.Status, &c.ev.Reason, &c.ev.OccurredAt,
		&c.ev.Attempt}, func() error {
		batch = append(batch, c)
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("fault: claim callbacks: %w", err)
	}
	n.Claimed = len(batch)
	for _, c := range batch {
		status, perr := s.push(ctx, c.ev)
		if ctx.Err() != nil {
			return n, nil // the lease runs out; pushed again later, as after a crash
		}
		ok := perr == nil && status/100 == 2
		var lastErr *string
		if perr != nil {
			lastErr = ptrTo(perr.Error())
		} else if !ok {
			lastErr = ptrTo(fmt.Sprintf("answered %d", status))
		}
		var lastStatus *int
		if perr == nil {
			lastStatus = &status
		}
		tag, err := s.pool.Exec(ctx, `
			UPDATE `+s.outbox.name+`
			   SET delivered_at = CASE WHEN $3 THEN now() END,
			       -- not delivered: again after a backoff doubling with each attempt
			       deliver_after = CASE WHEN $3 THEN deliver_after
			                            ELSE now() + make_interval(secs => least($6 * 2 ^ least(attempts - 1, 30), $7)) END,
			       last_status = $4,
			       last_error = $5,
			       lease_token = NULL
			 WHERE id = $1
			   AND lease_token = $2 -- the fence: 0 rows when the lease ran out and another sender took it`,
			c.id, token, ok, lastStatus, lastErr, s.cfg.MinBackoff.Seconds(), s.cfg.MaxBackoff.Seconds())
		switch {
		case err != nil:
			return n, fmt.Errorf("fault: record a push: %w", err)
		case tag.RowsAffected() == 0:
			n.Fenced++
		case ok:
			n.Delivered++
		default:
			n.Retried++
		}
	}
	return n, nil
}

// push sends one copy, signed now, and returns the answer's status.
func (s *Sender) push(ctx context.Context, ev webhook.Event) (int, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	webhook.SetHeaders(req.Header, s.cfg.Secret, ev.ID, time.Now(), body)
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, nil
}

func ptrTo[T any](v T) *T { return &v }

// WebhookAPI is the control API of a fake's callbacks:
//
//	GET /v1/webhooks   the setting and the outbox ledger
//	PUT /v1/webhooks   set the mode and delay
type WebhookAPI struct {
	Service
	Outbox Outbox
}

// Register adds the routes to mux, behind the service's Access.
func (a WebhookAPI) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/webhooks", a.Control.Guard(a.handleGet))
	mux.HandleFunc("PUT /v1/webhooks", a.Control.Guard(a.handlePut))
}

func (a WebhookAPI) handleGet(w http.ResponseWriter, r *http.Request) {
	l, err := a.Outbox.Ledger(r.Context(), a.Pool, a.Store, 50)
	if err != nil {
		InternalError(a.Log, w, err)
		return
	}
	WriteJSON(w, http.StatusOK, l)
}

func (a WebhookAPI) handlePut(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			WriteError(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "send the setting as application/json")
			return
		}
	}
	ws := DefaultWebhookSettings()
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ws); err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_json", `the body must be {"mode": "…", "delay_ms": n}: `+err.Error())
		return
	}
	got, err := a.Store.SetWebhookSettings(r.Context(), ws)
	var invalid *InvalidError
	switch {
	case errors.As(err, &invalid):
		WriteJSON(w, http.StatusUnprocessableEntity, ErrorBody{Error: "invalid_fault", Field: invalid.Field, Message: invalid.Message})
	case err != nil:
		InternalError(a.Log, w, err)
	default:
		WriteJSON(w, http.StatusOK, got)
	}
}

// Webhooks returns the fake's callback setting and outbox ledger, over the
// control API.
func (c *ControlClient) Webhooks(ctx context.Context) (WebhookLedger, error) {
	var l WebhookLedger
	err := c.Do(ctx, http.MethodGet, "/v1/webhooks", nil, &l)
	return l, err
}

// SetWebhookSettings sets the fake's callback setting, over the control API.
func (c *ControlClient) SetWebhookSettings(ctx context.Context, w WebhookSettings) (WebhookSettings, error) {
	var got WebhookSettings
	err := c.Do(ctx, http.MethodPut, "/v1/webhooks", w, &got)
	return got, err
}
