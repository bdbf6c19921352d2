package web

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// eventsSnapshot is GET /api/v1/events.
type eventsSnapshot struct {
	Overview events.Overview   `json:"overview"`
	Events   []events.EventRow `json:"events"`
}

// handleEventsAPI: GET /api/v1/events?status= (admin) — the outbox counts,
// what each consumer deduplicated, and the newest events with every
// publish and delivery.
func (app *App) handleEventsAPI(c echo.Context) error {
	status := c.QueryParam("status")
	if status != "" && status != "PENDING" && status != "SENT" && status != "DEAD" {
		return invalidParam("status", "status must be PENDING, SENT or DEAD")
	}
	ctx := c.Request().Context()
	o, err := app.events.Overview(ctx)
	if err != nil {
		return err
	}
	list, err := app.events.Recent(ctx, events.ListFilter{Status: status, Limit: 50})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, eventsSnapshot{Overview: o, Events: list})
}

// handleMailboxAPI: GET /api/v1/mailbox — the caller's messages, newest first.
func (app *App) handleMailboxAPI(c echo.Context) error {
	u, _ := userFrom(c)
	list, err := app.events.Mailbox(c.Request().Context(), u.ID, 50)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"messages": list})
}

// injectorBody is the JSON of PUT /api/v1/admin/events/injector.
type injectorBody struct {
	Mode     string `json:"mode"`     // "" clears the script
	Consumer string `json:"consumer"` // "" = every consumer
	Count    int    `json:"count"`
}

// handleGetInjectorAPI: GET /api/v1/admin/events/injector — the script.
func (app *App) handleGetInjectorAPI(c echo.Context) error {
	list, err := app.injector.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"script": list})
}

// handlePutInjectorAPI: PUT /api/v1/admin/events/injector — replaces the
// script (a setting: sending it twice leaves the same script).
func (app *App) handlePutInjectorAPI(c echo.Context) error {
	var in injectorBody
	if err := decodeJSON(c, &in); err != nil {
		return err
	}
	if err := app.setInjector(c.Request().Context(), in); err != nil {
		return err
	}
	return app.handleGetInjectorAPI(c)
}

func (app *App) setInjector(ctx context.Context, in injectorBody) error {
	if in.Consumer != "" && !slices.Contains(events.Consumers, in.Consumer) {
		return refuse(errValidation, "Invalid consumer",
			"consumer must be one of "+strings.Join(events.Consumers, ", ")+", or empty for every one").With("field", "consumer")
	}
	if in.Mode == "" {
		return app.injector.Clear(ctx)
	}
	mode, err := events.ParseMode(in.Mode)
	if err != nil {
		return refuse(errValidation, "Invalid mode",
			fmt.Sprintf("mode must be one of %v", events.Modes)).With("field", "mode")
	}
	if in.Count < 1 || in.Count > 1000 {
		return refuse(errValidation, "Invalid count",
			"count must be a whole number from 1 to 1000").With("field", "count")
	}
	_, err = app.injector.Set(ctx, mode, in.Consumer, in.Count)
	return err
}

// handleInjectorForm: POST /events/injector (admin form).
func (app *App) handleInjectorForm(c echo.Context) error {
	n, err := strconv.Atoi(c.FormValue("count"))
	if err != nil {
		n = 0
	}
	in := injectorBody{Mode: c.FormValue("mode"), Consumer: c.FormValue("consumer"), Count: n}
	if err := app.setInjector(c.Request().Context(), in); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/events")
}

// handleReplayAPI: POST /api/v1/admin/events/:id/replay (admin,
// Idempotency-Key) — a dead letter back to the relay.
func (app *App) handleReplayAPI(c echo.Context) error {
	return app.replay(c, func(c echo.Context, r events.Replayed, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return idempotency.JSONResponse(http.StatusOK, r)
	})
}

// handleReplayForm: POST /events/:id/replay (admin, keyed form): back to
// the page, which shows the row PENDING (or the refusal in words).
func (app *App) handleReplayForm(c echo.Context) error {
	return app.replay(c, func(c echo.Context, r events.Replayed, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer("/events")
	})
}

func (app *App) replay(c echo.Context, answer answerer[events.Replayed]) error {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return refuse(errNoSuchResource, "Not found", "no event with that id")
	}
	return respond(c, answer, func(hooks workflow.Hooks[events.Replayed]) error {
		_, err := events.ReplayDead(c.Request().Context(), app.pool, id, hooks)
		return err
	})
}

// guarantees says what each transport promises, for the page.
var guarantees = map[string]string{
	events.TransportNATS: "a relay publishes each outbox row to NATS JetStream with the event id as Nats-Msg-Id and marks it sent after the broker's ack; " +
		"consumers ack after their commit. At least once: a lost ack or a crash redelivers.",
	events.TransportRiver: "each event's River jobs are inserted in the writer's own transaction (the outbox is the queue); " +
		"River's retries, job timeout and rescuer run each job at least once.",
	events.TransportKafka: "a relay produces each outbox row to a Kafka topic, keyed by its event id, and marks it sent after the acks; " +
		"each consumer is a consumer group that commits its offsets after its commit. At least once: a crash, a lost commit or a rebalance redelivers from the committed offset.",
	events.TransportTasks: "a relay creates one Cloud Tasks task per event and consumer, named by the event id; the queue pushes it to the app " +
		"until a push is answered 2xx. At least once: a failed push, or one not answered within the dispatch deadline, is pushed again — after the handler's commit too.",
}

// transportRows is the page's table of the four transports: each one's
// guarantee in short, the layer before the consumer that dedupes and for
// how long, and what each layer caught here.
func (app *App) transportRows(o events.Overview) []views.TransportRow {
	short := map[string][2]string{ // delivery; the layer before the inbox
		events.TransportNATS:  {"at least once: redelivered after AckWait, or at once on a Nak", "the stream drops a repeated publish of a Nats-Msg-Id"},
		events.TransportRiver: {"at least once: a failed job is retried, a stuck one rescued", "none: every rerun reaches the consumer"},
		events.TransportKafka: {"at least once: from the committed offset, after a crash, a lost commit or a rebalance", "none on the event id: the idempotent producer stores one session's retries once"},
		events.TransportTasks: {"at least once: pushed again on a non-2xx or past the dispatch deadline", "the queue refuses a second create of a task name"},
	}
	window := map[string]string{
		events.TransportNATS:  app.cfg.EventsWindow.String() + " after the first publish",
		events.TransportRiver: "—",
		events.TransportKafka: "one producer session",
		events.TransportTasks: app.cfg.TasksWindow.String() + " after the task ran (Cloud Tasks: about an hour)",
	}
	var rows []views.TransportRow
	for _, t := range o.Transports {
		rows = append(rows, views.TransportRow{Transport: t.Transport, Current: t.Transport == o.Transport,
			Delivery: short[t.Transport][0], Layer: short[t.Transport][1], Window: window[t.Transport],
			BrokerDups: t.BrokerDuplicates, InboxDups: t.InboxDuplicates, Applied: t.Applied})
	}
	return rows
}

// handleEventsPage: GET /events — everyone signed in; the injector and
// the replay buttons for admins only.
func (app *App) handleEventsPage(c echo.Context) error {
	u, _ := userFrom(c)
	ctx := c.Request().Context()
	o, err := app.events.Overview(ctx)
	if err != nil {
		return err
	}
	// Everyone sees the counts and their own mailbox; the events themselves
	// (other customers' policies and bookings) and the books are the admin's.
	var recent []events.EventRow
	var ledger []events.LedgerDay
	if u.IsAdmin() {
		if recent, err = app.events.Recent(ctx, events.ListFilter{Limit: 30}); err != nil {
			return err
		}
		if ledger, err = app.events.Ledger(ctx, 7); err != nil {
			return err
		}
	}
	mail, err := app.events.Mailbox(ctx, u.ID, 20)
	if err != nil {
		return err
	}
	v := views.EventsView{
		Admin: u.IsAdmin(), Instance: app.cfg.InstanceID, Transport: o.Transport, Guarantee: guarantees[o.Transport],
		Broker: app.cfg.EventsBroker, BrokerAway: app.brokerAway(ctx),
		Pending: o.Pending, Sent: o.Sent, Dead: o.Dead, BrokerDups: o.BrokerDuplicates,
		History:       views.HistoryOrder{Aggregates: o.History.Aggregates, ParkedThenApplied: o.History.ParkedThenApplied, ParkedNow: o.History.ParkedNow},
		ConsumerNames: events.Consumers, ReplayKey: newFormKey, Transports: app.transportRows(o),
	}
	switch o.Transport {
	case events.TransportNATS:
		v.Window = app.cfg.EventsWindow.String()
	case events.TransportTasks:
		v.Window = app.cfg.TasksWindow.String()
	}
	if o.Pending > 0 {
		v.OldestPending = (time.Duration(o.OldestPendingSeconds*1000) * time.Millisecond).String()
	}
	for _, m := range events.Modes {
		v.Modes = append(v.Modes, string(m))
	}
	for _, cs := range o.Consumers {
		v.Consumers = append(v.Consumers, views.ConsumerCount{Consumer: cs.Consumer, Applied: cs.Applied,
			Duplicates: cs.Duplicates, Deferred: cs.Deferred, Failed: cs.Failed})
	}
	if v.Admin {
		script, err := app.injector.List(ctx)
		if err != nil {
			return err
		}
		for _, s := range script {
			if s.Remaining > 0 {
				consumer := ""
				if s.Consumer != nil {
					consumer = *s.Consumer
				}
				v.Script = append(v.Script, views.InjectionRow{Mode: string(s.Mode), Consumer: consumer, Remaining: s.Remaining})
			}
		}
	}
	for _, e := range recent {
		v.Events = append(v.Events, eventLine(e, u.IsAdmin()))
	}
	for _, d := range ledger {
		v.Ledger = append(v.Ledger, views.LedgerLine{Day: d.Day.Format("Mon 2 Jan 2006"), Cancellations: d.Cancellations,
			Refunds: d.Refunds, Confirmed: d.BookingsConfirmed, Released: d.BookingsReleased})
	}
	for _, m := range mail {
		v.Mailbox = append(v.Mailbox, views.MailLine{At: m.CreatedAt.Format(timeOfDay), Subject: m.Subject, Body: m.Body, EventID: m.EventID.String()})
	}
	if v.BrokerAway != "" && !v.Admin {
		// a customer reads the cause without the broker's address (redact.go)
		v.BrokerAway = "The events' broker does not answer just now. The outbox keeps every event: none is lost, and your mailbox fills once it answers."
	}
	p := app.page(c, "Events", "events")
	p.BrokerAway = "" // said on this page, beside the unsent count
	return render(c, http.StatusOK, views.EventsPage(p, v))
}

const timeOfDay = "15:04:05.000"

// shortEventID is the part of an event id that tells events apart: its
// tail. A UUIDv7 begins with its time in milliseconds, so the events of one
// moment share their first eight characters.
func shortEventID(id uuid.UUID) string {
	s := id.String()
	return "…" + s[len(s)-8:]
}

func eventLine(e events.EventRow, admin bool) views.EventLine {
	l := views.EventLine{ID: e.ID.String(), ShortID: shortEventID(e.ID), Type: e.Type, Key: e.Key, Status: e.Status,
		Attempts: e.Attempts, Created: e.CreatedAt.Format(timeOfDay)}
	if e.LastError != nil && admin { // an operator's error text, not a customer's
		l.LastError = *e.LastError
	}
	for _, p := range e.Publishes {
		pl := views.PublishLine{At: p.At.Format(timeOfDay), Instance: p.Instance, Duplicate: p.Duplicate}
		if p.Injected != nil {
			pl.Injected = *p.Injected
		}
		if p.Duplicate {
			l.Duplicates++
		}
		l.Publishes = append(l.Publishes, pl)
	}
	nth := map[string]int{} // deliveries so far, by consumer
	for _, d := range e.Deliveries {
		nth[d.Consumer]++
		dl := views.DeliveryLine{At: d.At.Format(timeOfDay), Consumer: d.Consumer, Instance: d.Instance, Outcome: d.Outcome,
			Attempt: d.Attempt, Nth: nth[d.Consumer]}
		if d.CaughtBy != nil {
			dl.CaughtBy = *d.CaughtBy
		}
		if d.Injected != nil {
			dl.Injected = *d.Injected
		}
		if admin {
			dl.Detail = d.Detail
		}
		switch d.Outcome {
		case events.OutcomeApplied:
			l.Applied++
		case events.OutcomeDuplicate:
			l.Duplicates++
		}
		l.Deliveries = append(l.Deliveries, dl)
	}
	return l
}
