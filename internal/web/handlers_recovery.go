package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// recoverySnapshot is GET /api/v1/recovery and what the recovery page shows.
type recoverySnapshot struct {
	Instance string                   `json:"instance"`
	Settings recoverySettings         `json:"settings"`
	Counts   map[string]int           `json:"counts"`
	Live     []workflow.LiveOperation `json:"live"`
	Recent   []workflow.RecoveryEvent `json:"recent"`
	Beliefs  []workflow.Belief        `json:"systems"`
}

type recoverySettings struct {
	Strategy    string  `json:"strategy"`
	IntervalS   float64 `json:"interval_seconds"`
	LeaseS      float64 `json:"lease_seconds"`
	MaxPolls    int     `json:"max_polls"`
	PollTimeS   float64 `json:"max_poll_seconds"`
	MaxAttempts int     `json:"max_attempts"`
	ClockSkewS  float64 `json:"clock_skew_seconds"`
	ReaskS      float64 `json:"reask_interval_seconds"`
	BoundS      float64 `json:"bound_seconds"`
}

// recoverySnapshot is for everyone signed in; a customer reads it with
// summaries in place of error texts (redact.go).
func (app *App) recoverySnapshot(ctx context.Context, admin bool) (recoverySnapshot, error) {
	counts, err := app.engine.CountByStatus(ctx)
	if err != nil {
		return recoverySnapshot{}, err
	}
	live, err := app.engine.ListLive(ctx, 50)
	if err != nil {
		return recoverySnapshot{}, err
	}
	recent, err := app.engine.RecentRecoveryEvents(ctx, 30)
	if err != nil {
		return recoverySnapshot{}, err
	}
	beliefs, err := workflow.Beliefs(ctx, app.pool)
	if err != nil {
		return recoverySnapshot{}, err
	}
	if !admin {
		for i := range live {
			live[i].Operation = customerOperation(live[i].Operation)
		}
		for i := range recent {
			recent[i].Detail = redactAddresses(recent[i].Detail)
		}
	}
	cfg := app.recovery.Settings()
	b := cfg.Budget()
	return recoverySnapshot{
		Instance: app.cfg.InstanceID,
		Settings: recoverySettings{
			Strategy: string(cfg.Strategy), IntervalS: cfg.Interval.Seconds(), LeaseS: b.Lease.Seconds(),
			MaxPolls: b.MaxPolls, PollTimeS: b.MaxPollTime().Seconds(), MaxAttempts: b.MaxAttempts,
			ClockSkewS: b.ClockSkew.Seconds(), ReaskS: b.ReaskInterval.Seconds(), BoundS: app.recovery.Bound().Seconds(),
		},
		Counts: counts, Live: live, Recent: recent, Beliefs: beliefs,
	}, nil
}

// handleRecoveryAPI: GET /api/v1/recovery
func (app *App) handleRecoveryAPI(c echo.Context) error {
	u, _ := userFrom(c)
	s, err := app.recoverySnapshot(c.Request().Context(), u.IsAdmin())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, s)
}

// handleRecoveryPage: GET /recovery — for everyone, refreshing itself.
func (app *App) handleRecoveryPage(c echo.Context) error {
	v, err := app.recoveryView(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RecoveryPage(app.page(c, "Recovery", "recovery"), v))
}

// handleRecoveryPanel: GET /recovery/panel — the htmx partial.
func (app *App) handleRecoveryPanel(c echo.Context) error {
	v, err := app.recoveryView(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RecoveryPanel(v))
}

func (app *App) recoveryView(c echo.Context) (views.RecoveryView, error) {
	u, _ := userFrom(c)
	s, err := app.recoverySnapshot(c.Request().Context(), u.IsAdmin())
	if err != nil {
		return views.RecoveryView{}, err
	}
	cfg := app.recovery.Settings()
	b := cfg.Budget()
	v := views.RecoveryView{
		Instance: s.Instance, Strategy: s.Settings.Strategy, Interval: cfg.Interval.String(), Lease: b.Lease.String(),
		MaxPolls: b.MaxPolls, PollTime: b.MaxPollTime().String(), MaxAttempts: b.MaxAttempts,
		ClockSkew: b.ClockSkew.String(), Reask: b.ReaskInterval.String(),
		Bound: app.recovery.Bound().Round(100 * time.Millisecond).String(),
	}
	for _, st := range workflow.Statuses {
		v.Counts = append(v.Counts, views.StatusCount{Status: st, N: s.Counts[st]})
	}
	for _, b := range s.Beliefs {
		v.Beliefs = append(v.Beliefs, views.Belief{System: b.System, Idempotent: b.Idempotent,
			By: b.UpdatedBy + " at " + b.UpdatedAt.UTC().Format("15:04:05 MST")})
	}
	for _, l := range s.Live {
		row := views.LiveOperation{
			ID: l.ID, PolicyID: l.PolicyID, Status: l.Status, Owner: deref(l.OwnerID), Lease: timeText(l.LeaseExpiresAt),
			Attempts: l.Attempts, LastError: deref(l.LastError), State: "owned", StateKind: "DONE",
		}
		switch {
		case l.Stale && l.Due:
			row.State, row.StateKind = "stale: claimable now", "IN_PROGRESS"
		case l.Stale:
			row.State, row.StateKind = "backing off until "+timeText(l.NextAttemptAt), "PENDING"
		}
		v.Live = append(v.Live, row)
	}
	for _, r := range s.Recent {
		v.Recent = append(v.Recent, views.RecoveryStep{
			At: r.At.UTC().Format("15:04:05.000"), OperationID: r.OperationID, Branch: deref(r.Branch),
			Worker: r.Actor, To: r.ToStatus, Detail: r.Detail,
		})
	}
	return v, nil
}

// handleReconciliationAPI: GET /api/v1/admin/reconciliation (admin)
func (app *App) handleReconciliationAPI(c echo.Context) error {
	ops, err := app.engine.ListByStatus(c.Request().Context(), workflow.StatusNeedsReconciliation, 100)
	if err != nil {
		return err
	}
	if ops == nil {
		ops = []workflow.Operation{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ops})
}

// handleReconciliationPage: GET /reconciliation (admin) — operations that
// need a person, with their evidence and three keyed decision forms.
func (app *App) handleReconciliationPage(c echo.Context) error {
	ctx := c.Request().Context()
	ops, err := app.engine.ListByStatus(ctx, workflow.StatusNeedsReconciliation, 100)
	if err != nil {
		return err
	}
	v := views.ReconciliationView{}
	// The notice names only what parses: a query string is anyone's to write.
	if id, err := parseID(c.QueryParam("resolved")); err == nil {
		if action, ok := workflow.ParseResolution(c.QueryParam("action")); ok {
			v.Notice = fmt.Sprintf("Cancellation #%d: decision recorded (%s). It is on the operation's timeline.", id, action)
		}
	}
	for _, op := range ops {
		item, err := app.reconcileItem(ctx, op)
		if err != nil {
			return err
		}
		v.Items = append(v.Items, item)
	}
	return render(c, http.StatusOK, views.ReconciliationPage(app.page(c, "Reconciliation", "recovery"), v))
}

func (app *App) reconcileItem(ctx context.Context, op workflow.Operation) (views.ReconcileItem, error) {
	pol, err := app.policies.Get(ctx, op.UserID, op.PolicyID)
	if err != nil {
		return views.ReconcileItem{}, err
	}
	timeline, err := app.engine.Timeline(ctx, op.ID)
	if err != nil {
		return views.ReconcileItem{}, err
	}
	item := views.ReconcileItem{
		ID: op.ID, PolicyID: op.PolicyID, PolicyNumber: pol.Number, Attempts: op.Attempts, LastError: deref(op.LastError),
		Updated: op.UpdatedAt.UTC().Format("15:04:05 MST"), SeenUpdatedAt: op.UpdatedAt.Format(time.RFC3339Nano),
		Keys: map[string]string{}, DoneAction: "mark_done", DoneLabel: "It happened: mark done",
	}
	for _, s := range op.Steps {
		if s.State == workflow.StepDone {
			continue
		}
		item.Step, item.System, item.StepKey, item.RecordedTruth = s.Name, deref(s.System), s.Key, deref(s.Truth)
		// Only the first external step may fail the operation: nothing
		// done elsewhere stands before it.
		item.CanFail = s.Name == policies.StepProviderCancel
		if s.Name == policies.StepProviderCancel {
			item.DoneAction, item.DoneLabel = "mark_cancelled", "Provider confirms: mark cancelled"
		}
		if s.External() {
			askCtx, cancel := context.WithTimeout(ctx, time.Second)
			if truth, err := app.engine.Truth(askCtx, op, s.Name); err != nil {
				item.LiveError = err.Error()
			} else {
				item.LiveTruth = string(truth)
			}
			cancel()
		}
		break
	}
	for _, action := range []string{item.DoneAction, "retry", "mark_failed"} {
		item.Keys[action] = newFormKey()
	}
	for _, e := range timeline {
		item.Timeline = append(item.Timeline, views.TimelineEvent{
			At: e.At.UTC().Format("15:04:05.000"), From: deref(e.FromStatus), To: e.ToStatus, Step: deref(e.Step), Actor: e.Actor, Detail: e.Detail,
		})
	}
	return item, nil
}

// resolveBody is the JSON of POST /api/v1/admin/operations/{id}/resolve.
type resolveBody struct {
	Action        string    `json:"action"`          // mark_done (mark_cancelled) | retry | mark_failed
	SeenUpdatedAt time.Time `json:"seen_updated_at"` // the operation's updated_at as the admin saw it
	Note          string    `json:"note"`
}

// handleResolveAPI: POST /api/v1/admin/operations/:id/resolve (admin,
// Idempotency-Key). 200 with the operation · 409 state-changed when it is
// no longer as seen.
func (app *App) handleResolveAPI(c echo.Context) error {
	var in resolveBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	return app.resolve(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return idempotency.JSONResponse(http.StatusOK, op)
	})
}

// handleResolveForm: POST /reconciliation/:id/resolve (admin form, hidden
// idempotency_key). The answer — a redirect back to the list — is stored
// with the decision, so a double-click replays it.
func (app *App) handleResolveForm(c echo.Context) error {
	seen, err := time.Parse(time.RFC3339Nano, c.FormValue("seen_updated_at"))
	if err != nil {
		return problem.New(http.StatusBadRequest, "invalid-parameter", "Invalid form", "the form lacks the state it was shown for; reload the page")
	}
	in := resolveBody{Action: c.FormValue("action"), SeenUpdatedAt: seen, Note: c.FormValue("note")}
	return app.resolve(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		switch {
		case errors.Is(refusal, workflow.ErrStateChanged):
			// Said in words, and stored as this form's answer like any other.
			n := views.Notice{
				Title: "Someone else already resolved it",
				Message: "This cancellation is no longer in the state this page showed you, so your decision was not applied. " +
					"Another admin (or the recovery loop, after a retry) got there first; its timeline says what happened.",
				Back: "/reconciliation", BackLabel: "Back to reconciliation",
			}
			return pageAnswer(c, http.StatusConflict, views.NoticePage(app.page(c, n.Title, "recovery"), n))
		case refusal != nil:
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(fmt.Sprintf("/reconciliation?resolved=%d&action=%s", op.ID, c.FormValue("action")))
	})
}

// resolve is the one call both resolve handlers make.
func (app *App) resolve(c echo.Context, in resolveBody, answer answerer[workflow.Operation]) error {
	req, err := app.resolveRequest(c, in)
	if err != nil {
		return err
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := app.engine.Resolve(c.Request().Context(), req, hooks)
		return err
	})
}

func (app *App) resolveRequest(c echo.Context, in resolveBody) (workflow.ResolveRequest, error) {
	id, err := pathID(c, "id")
	if err != nil {
		return workflow.ResolveRequest{}, err
	}
	res, ok := workflow.ParseResolution(in.Action)
	if !ok {
		return workflow.ResolveRequest{}, problem.New(http.StatusUnprocessableEntity, "validation-failed", "Invalid action",
			"action must be mark_done (or mark_cancelled), retry or mark_failed").With("field", "action")
	}
	if in.SeenUpdatedAt.IsZero() {
		return workflow.ResolveRequest{}, problem.New(http.StatusUnprocessableEntity, "validation-failed", "Missing state",
			"seen_updated_at must be the operation's updated_at as you saw it").With("field", "seen_updated_at")
	}
	if err := validText("note", in.Note, maxTextLength); err != nil {
		return workflow.ResolveRequest{}, err
	}
	u, _ := userFrom(c)
	return workflow.ResolveRequest{
		OperationID: id, Resolution: res, SeenUpdatedAt: in.SeenUpdatedAt, Note: in.Note,
		Actor: u.Name + " (admin, " + app.actor(c) + ")",
	}, nil
}
