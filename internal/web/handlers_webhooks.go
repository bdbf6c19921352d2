package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/webhook"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// callbackSystems are the systems that may call back.
var callbackSystems = map[string]bool{"provider": true, "payments": true}

// newCallbackCounter counts every callback by system and what became of it:
// applied, noted, stale, unknown_step, duplicate, deferred (409: the
// request still waits for the call's own answer), and the refusals —
// refused_system (system "unknown"), refused_oversized, refused_missing,
// refused_signature, refused_stale, refused_invalid — that wrote nothing.
func newCallbackCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemlab_callbacks_total",
		Help: "Callbacks received, by system and outcome (refused_* wrote nothing).",
	}, []string{"system", "outcome"})
	reg.MustRegister(c)
	return c
}

// handleWebhook is POST /webhooks/:system, a callback from the provider or
// payments. In order, each refusal writing nothing:
//
//	unknown system                          404 not-found
//	body over maxCallbackBody               413 body-too-large
//	a signature header missing              400 webhook-unsigned
//	signature does not match (forged)       401 webhook-signature
//	timestamp outside ±5 min (replayed)     401 webhook-stale
//	body not one event, or not its header's 422 webhook-invalid
//	the request still waits for the answer  409 webhook-deferred + Retry-After (sent again later)
//
// and otherwise 200 with what the callback did (workflow.Callback): applied,
// noted, stale, unknown_step or duplicate — each the end of this event, so
// the sender stops.
// maxCallbackBody bounds a callback's body far below BODY_LIMIT: one event
// (an id and a key of at most 200 characters, a reason of at most 1000) is
// well under it.
const maxCallbackBody = 16 << 10

func (app *App) handleWebhook(c echo.Context) error {
	system := c.Param("system")
	if !callbackSystems[system] {
		// Counted under one label, not the caller's name: a scanner must
		// not mint a time series per path it tries.
		app.callbacks.WithLabelValues("unknown", "refused_system").Inc()
		return problem.New(http.StatusNotFound, "not-found", "No such system", "no system "+system+" calls back here")
	}
	if app.webhookSecret == nil {
		return problem.New(http.StatusNotFound, "not-found", "Callbacks are off", "this instance has no webhook secret")
	}
	body, _ := io.ReadAll(c.Request().Body) // read in full by limitBody
	if len(body) > maxCallbackBody {
		// Refused before the HMAC is computed over it: a forger's megabyte
		// costs a length check, not a hash.
		app.callbacks.WithLabelValues(system, "refused_oversized").Inc()
		return problem.New(http.StatusRequestEntityTooLarge, "body-too-large", "Callback too large",
			fmt.Sprintf("a callback event is at most %d bytes: nothing was applied", maxCallbackBody))
	}
	id, err := webhook.Verify(c.Request().Header, app.webhookSecret, body, time.Now(), webhook.Tolerance)
	if err != nil {
		outcome, p := "refused_signature", problem.New(http.StatusUnauthorized, "webhook-signature", "Signature does not match",
			"the Webhook-Signature is not the HMAC of this id, timestamp and body under the shared secret: nothing was applied")
		switch {
		case errors.Is(err, webhook.ErrMissing):
			outcome, p = "refused_missing", problem.New(http.StatusBadRequest, "webhook-unsigned", "Callback not signed",
				"Webhook-Id, Webhook-Timestamp and Webhook-Signature are all required: nothing was applied")
		case errors.Is(err, webhook.ErrStale):
			outcome, p = "refused_stale", problem.New(http.StatusUnauthorized, "webhook-stale", "Callback outside the tolerance window",
				err.Error()+": a replayed or delayed copy; nothing was applied")
		}
		app.callbacks.WithLabelValues(system, outcome).Inc()
		return p
	}
	ev, err := parseEvent(body, id)
	if err != nil {
		app.callbacks.WithLabelValues(system, "refused_invalid").Inc()
		return problem.New(http.StatusUnprocessableEntity, "webhook-invalid", "Callback not understood", err.Error()+": nothing was applied")
	}
	res, err := app.engine.Callback(c.Request().Context(), workflow.Callback{System: system, EventID: ev.ID, StepKey: ev.Key,
		Truth: external.Truth(ev.Status), Reason: ev.Reason, Attempt: ev.Attempt})
	if errors.Is(err, workflow.ErrOwnerBusy) {
		app.callbacks.WithLabelValues(system, "deferred").Inc()
		c.Response().Header().Set("Retry-After", "1")
		return problem.New(http.StatusConflict, "webhook-deferred", "Come again",
			"the request that made this call is still waiting for its answer: nothing was applied; send it again later")
	}
	if err != nil {
		return err
	}
	app.callbacks.WithLabelValues(system, string(res.Outcome)).Inc()
	return c.JSON(http.StatusOK, res)
}

// parseEvent reads one callback event, strictly: known fields only, the
// body's id equal to the signed header's, a known status, a key of a
// sane length.
func parseEvent(body []byte, headerID string) (webhook.Event, error) {
	var ev webhook.Event
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return ev, errors.New("the body is not one callback event: " + err.Error())
	}
	if dec.More() {
		return ev, errors.New("the body holds more than one JSON value")
	}
	switch {
	case ev.ID != headerID:
		return ev, errors.New("the body's id is not the Webhook-Id that was signed")
	case ev.Key == "" || len(ev.Key) > 200 || len(ev.ID) > 200 || len(ev.Reason) > 1000:
		return ev, errors.New("key must be 1 to 200 characters (id up to 200, reason up to 1000)")
	case ev.Status != string(external.TruthRunning) && ev.Status != string(external.TruthCompleted) &&
		ev.Status != string(external.TruthRejected):
		return ev, errors.New(`status must be "RUNNING", "COMPLETED" or "REJECTED"`)
	case ev.Attempt < 1 || ev.Attempt > 1_000_000:
		return ev, errors.New("attempt must be a positive count")
	}
	return ev, nil
}

// webhooksJSON is GET /api/v1/{system}/webhooks: what the fake sent (its
// setting and outbox) and what the app received (its inbox), with the
// callbacks kept for a person.
type webhooksJSON struct {
	Sender   fault.WebhookLedger        `json:"sender"`
	Received []readmodel.CallbackRecord `json:"received"`
	Kept     []readmodel.CallbackRecord `json:"kept_for_a_person"`
}

func (app *App) webhooks(c echo.Context, s fakeAdmin) (webhooksJSON, error) {
	ctx := c.Request().Context()
	var v webhooksJSON
	var err error
	if v.Sender, err = s.control.Webhooks(ctx); err != nil {
		return v, s.controlError(c, err)
	}
	if v.Received, err = readmodel.Callbacks(ctx, app.pool, readmodel.CallbackFilter{System: s.name}); err != nil {
		return v, err
	}
	v.Kept, err = readmodel.Callbacks(ctx, app.pool, readmodel.CallbackFilter{System: s.name, UnknownOnly: true})
	return v, err
}

// handleGetWebhooks: GET /api/v1/{system}/webhooks (admin).
func (app *App) handleGetWebhooks(s fakeAdmin) echo.HandlerFunc {
	return func(c echo.Context) error {
		v, err := app.webhooks(c, s)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, v)
	}
}

// putWebhooks: PUT /api/v1/{system}/webhooks (admin) — {"mode": "off|ok|
// duplicate|delay|reorder|lost", "delay_ms": n} (fields left out keep
// fault.DefaultWebhookSettings') → 200 the setting · 422 invalid-fault with
// the field · 400 invalid-json · 415. A setting: no Idempotency-Key.
func (s fakeAdmin) putWebhooks(c echo.Context) error {
	w := fault.DefaultWebhookSettings()
	if err := decodeJSON(c, &w); err != nil {
		return err
	}
	got, err := s.control.SetWebhookSettings(c.Request().Context(), w)
	if err != nil {
		return s.controlError(c, err)
	}
	return c.JSON(http.StatusOK, got)
}

// webhooksForm: POST /{system}/webhooks (admin) — the page's form, then
// back to the page.
func (s fakeAdmin) webhooksForm(c echo.Context) error {
	w := fault.WebhookSettings{Mode: fault.WebhookMode(c.FormValue("mode")), DelayMS: fault.DefaultWebhookSettings().DelayMS}
	if d := c.FormValue("delay_ms"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil {
			return problem.New(http.StatusBadRequest, "invalid-parameter", "Invalid delay", "delay_ms must be a whole number of milliseconds").
				With("parameter", "delay_ms")
		}
		w.DelayMS = n
	}
	if _, err := s.control.SetWebhookSettings(c.Request().Context(), w); err != nil {
		return s.controlError(c, err)
	}
	return c.Redirect(http.StatusSeeOther, s.page)
}

// callbacksView is the Callbacks section of a fake's page.
func (app *App) callbacksView(c echo.Context, s fakeAdmin) (views.CallbacksView, error) {
	v, err := app.webhooks(c, s)
	if err != nil {
		return views.CallbacksView{}, err
	}
	u, _ := userFrom(c)
	vm := views.CallbacksView{System: s.name, CanEdit: u.IsAdmin(), Mode: string(v.Sender.Settings.Mode), DelayMS: v.Sender.Settings.DelayMS,
		Queued: v.Sender.Queued, Delivered: v.Sender.Delivered, Lost: v.Sender.Lost, Retries: v.Sender.Retries}
	if !u.IsAdmin() {
		return vm, nil // the ledger names every customer's operations: the admin's to read
	}
	received := func(r readmodel.CallbackRecord) views.CallbackReceived {
		var opID int64
		if r.OperationID != nil {
			opID = *r.OperationID
		}
		return views.CallbackReceived{EventID: r.EventID, Key: r.StepKey, Status: r.Status, Received: r.ReceivedAt.UTC().Format("15:04:05.000"),
			Outcome: r.Outcome, Detail: r.Detail, Attempt: r.Attempt, Duplicates: r.Duplicates, OperationID: opID}
	}
	for i, r := range v.Received {
		if i == 20 {
			break
		}
		vm.Received = append(vm.Received, received(r))
	}
	for _, r := range v.Kept {
		vm.Kept = append(vm.Kept, received(r))
	}
	for _, w := range v.Sender.Recent {
		sent := views.CallbackSent{EventID: w.EventID, Key: w.Key, Status: w.Status, Due: w.DeliverAfter.UTC().Format("15:04:05.000"),
			Attempts: w.Attempts, Lost: w.Lost, Last: database.Deref(w.LastError)}
		if w.DeliveredAt != nil {
			sent.Delivered = w.DeliveredAt.UTC().Format("15:04:05.000")
		}
		vm.Sent = append(vm.Sent, sent)
	}
	return vm, nil
}
