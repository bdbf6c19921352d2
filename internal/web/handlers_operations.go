package web

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/views"
)

// operationView is an operation with its timeline and the provider's truth
// for the same key, side by side: what we know locally and what really
// happened remotely.
type operationView struct {
	policies.Operation
	Timeline []policies.Event `json:"timeline"`
	Provider providerTruth    `json:"provider"`
}

type providerTruth struct {
	Key   string `json:"key"`
	Truth string `json:"truth,omitempty"` // NOT_STARTED | RUNNING | COMPLETED | REJECTED
	Error string `json:"error,omitempty"` // why the truth is unknown right now
}

// loadOperation reads what the operation pages and GET /api/v1/operations/{id}
// show. Asking the provider is bounded, and its failure is shown, not fatal.
func (app *App) loadOperation(ctx context.Context, c echo.Context) (operationView, error) {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return operationView{}, err
	}
	op, err := app.policies.GetOperation(ctx, id, u.ID, u.IsAdmin())
	if err != nil {
		return operationView{}, err
	}
	timeline, err := app.policies.Timeline(ctx, op.ID)
	if err != nil {
		return operationView{}, err
	}
	v := operationView{Operation: op, Timeline: timeline, Provider: providerTruth{Key: op.ProviderKey}}
	askCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	truth, err := app.provider.Status(askCtx, op.ProviderKey)
	if err != nil {
		v.Provider.Error = err.Error()
	} else {
		v.Provider.Truth = string(truth)
	}
	if !u.IsAdmin() { // redact.go: a customer reads summaries, not internals
		v.Operation, v.Timeline = customerOperation(v.Operation), customerTimeline(v.Timeline)
		if v.Provider.Error != "" {
			v.Provider.Error = "the provider cannot be asked right now"
		}
	}
	return v, nil
}

// handleGetOperation: GET /api/v1/operations/:id
func (app *App) handleGetOperation(c echo.Context) error {
	v, err := app.loadOperation(c.Request().Context(), c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

// handleOperationPage: GET /operations/:id — local state, provider truth and
// timeline, refreshing itself until the operation is terminal.
func (app *App) handleOperationPage(c echo.Context) error {
	vm, err := app.operationPanel(c)
	if err != nil {
		return err
	}
	if c.QueryParam("notice") == "duplicate-intent" {
		vm.Notice = "This policy already had a cancellation under way (from an earlier click or another tab), so no second one was started. This is it."
	}
	return render(c, http.StatusOK, views.OperationPage(app.page(c, "Cancellation", "policies"), vm))
}

// handleOperationPanel: GET /operations/:id/panel — the htmx partial.
func (app *App) handleOperationPanel(c echo.Context) error {
	vm, err := app.operationPanel(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.OperationPanel(vm))
}

// operationPanel is the view model both the page and its htmx partial show.
func (app *App) operationPanel(c echo.Context) (views.OperationDetail, error) {
	v, err := app.loadOperation(c.Request().Context(), c)
	if err != nil {
		return views.OperationDetail{}, err
	}
	return app.operationDetail(c.Request().Context(), v)
}

func (app *App) operationDetail(ctx context.Context, v operationView) (views.OperationDetail, error) {
	pol, err := app.policies.Get(ctx, v.UserID, v.PolicyID)
	if err != nil {
		return views.OperationDetail{}, err
	}
	vm := views.OperationDetail{
		ID: v.ID, PolicyID: v.PolicyID, PolicyNumber: pol.Number, Status: v.Status, Terminal: v.Terminal(),
		Reason: v.Reason, Run: v.Run, Attempts: v.Attempts, ProviderKey: v.ProviderKey,
		Owner: deref(v.OwnerID), LeaseExpires: timeText(v.LeaseExpiresAt), NextAttempt: timeText(v.NextAttemptAt),
		LastError: deref(v.LastError), ProviderTruth: v.Provider.Truth, ProviderError: v.Provider.Error,
	}
	for _, name := range []string{policies.StepRecordIntent, policies.StepProviderCancel, policies.StepMarkCancelled} {
		if state, ok := v.Steps[name]; ok {
			vm.Steps = append(vm.Steps, views.Step{Name: name, State: state})
		}
	}
	for _, e := range v.Timeline {
		vm.Timeline = append(vm.Timeline, views.TimelineEvent{
			At: e.At.UTC().Format("15:04:05.000"), From: deref(e.FromStatus), To: e.ToStatus,
			Actor: e.Actor, Owner: shortToken(deref(e.OwnerToken)), Detail: e.Detail, Statement: strings.TrimSpace(e.Statement),
		})
	}
	return vm, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func timeText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("15:04:05.000 MST")
}

// shortToken shows the start of an owner token: enough to tell owners apart.
func shortToken(tok string) string {
	if len(tok) > 8 {
		return tok[:8]
	}
	return tok
}
