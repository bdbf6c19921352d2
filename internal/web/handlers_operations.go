package web

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// operationView is an operation with its steps, its timeline, its log of
// calls, and each system's truth for each external step's key, side by
// side: what we know locally and what really happened elsewhere.
type operationView struct {
	workflow.Operation
	Timeline []workflow.Event      `json:"timeline"`
	Calls    []workflow.CallRecord `json:"calls"`
	// Truths is each external step's system asked just now, by step name.
	Truths map[string]truthNow `json:"truths"`
	// Provider is Truths["provider_cancel"], where clients of the first
	// API version look for it.
	Provider truthNow `json:"provider"`
}

type truthNow struct {
	System string `json:"system"`
	Key    string `json:"key"`
	Truth  string `json:"truth,omitempty"` // NOT_STARTED | RUNNING | COMPLETED | REJECTED
	Error  string `json:"error,omitempty"` // why the truth is unknown right now
}

// loadOperation reads what the operation pages and GET /api/v1/operations/{id}
// show. Asking the systems is bounded, and a failure is shown, not fatal.
func (app *App) loadOperation(ctx context.Context, c echo.Context) (operationView, error) {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return operationView{}, err
	}
	op, err := app.engine.GetOperation(ctx, id, u.ID, u.IsAdmin())
	if err != nil {
		return operationView{}, err
	}
	return app.viewOperation(ctx, op, u.IsAdmin())
}

// viewOperation reads what the pages show of op: timeline, calls, each
// system's truth — redacted for anyone but an admin.
func (app *App) viewOperation(ctx context.Context, op workflow.Operation, admin bool) (operationView, error) {
	var err error
	v := operationView{Operation: op, Truths: map[string]truthNow{}}
	if v.Timeline, err = app.engine.Timeline(ctx, op.ID); err != nil {
		return operationView{}, err
	}
	if v.Calls, err = app.engine.Calls(ctx, op.ID); err != nil {
		return operationView{}, err
	}
	if v.Calls == nil {
		v.Calls = []workflow.CallRecord{}
	}
	askCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, s := range op.Steps {
		if !s.External() {
			continue
		}
		t := truthNow{System: *s.System, Key: s.Key}
		if truth, err := app.engine.Truth(askCtx, op, s.Name); err != nil {
			t.Error = err.Error()
		} else {
			t.Truth = string(truth)
		}
		v.Truths[s.Name] = t
	}
	v.Provider = v.Truths[policies.StepProviderCancel]
	if !admin { // redact.go: a customer reads summaries, not internals
		v.Operation, v.Timeline, v.Calls = customerOperation(v.Operation), customerTimeline(v.Timeline), customerCalls(v.Calls)
		for name, t := range v.Truths {
			if t.Error != "" {
				t.Error = "the " + t.System + " cannot be asked right now"
				v.Truths[name] = t
			}
		}
		v.Provider = v.Truths[policies.StepProviderCancel]
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

// handleOperationPage: GET /operations/:id — the steps, each system's truth,
// the calls and the timeline, refreshing itself until the operation is
// terminal.
func (app *App) handleOperationPage(c echo.Context) error {
	vm, err := app.operationPanel(c)
	if err != nil {
		return err
	}
	if c.QueryParam("notice") == "duplicate-intent" {
		vm.Notice = "This policy already had a cancellation under way (from an earlier click or another tab), so no second one was started. This is it."
	}
	title, nav := "Cancellation", "policies"
	if vm.BookingID != 0 {
		title, nav = vm.Kind, "slots"
	}
	return render(c, http.StatusOK, views.OperationPage(app.page(c, title, nav), vm))
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
	kind, subject := "Cancellation", ""
	if v.BookingID != 0 { // the deposit saga: its subject is a booking
		bk, err := app.slots.GetBooking(ctx, v.BookingID, v.UserID, true)
		if err != nil {
			return views.OperationDetail{}, err
		}
		kind, subject = sagaKind(v.Type), fmt.Sprintf("%s, %s", bk.Resource, bk.StartsAt.UTC().Format("Mon 2 Jan 15:04"))
	} else {
		pol, err := app.policies.Get(ctx, v.UserID, v.PolicyID)
		if err != nil {
			return views.OperationDetail{}, err
		}
		subject = pol.Number
	}
	vm := views.OperationDetail{
		ID: v.ID, Kind: kind, PolicyID: v.PolicyID, BookingID: v.BookingID, PolicyNumber: subject, Status: v.Status, Terminal: v.Terminal(),
		Reason: v.Reason, Run: v.Run, Attempts: v.Attempts,
		Owner: deref(v.OwnerID), LeaseExpires: timeText(v.LeaseExpiresAt), NextAttempt: timeText(v.NextAttemptAt),
		Released: releasedText(deref(v.Released)), LastError: deref(v.LastError),
	}
	current := ""
	for _, s := range v.Steps {
		if s.State != workflow.StepDone && current == "" {
			current = s.Name
		}
		step := views.Step{
			Position: s.Position, Name: s.Name, Key: s.Key, System: deref(s.System), State: s.State, Attempts: s.Attempts,
			Deadline: timeText(s.DeadlineAt), Sent: timeText(s.SentAt), Finished: timeText(s.FinishedAt),
			Request: prettyJSON(s.Request), Answer: prettyJSON(s.Answer), Recorded: deref(s.Truth),
			Current: s.Name == current && !v.Terminal(),
		}
		if t, ok := v.Truths[s.Name]; ok {
			step.LiveTruth, step.LiveError = t.Truth, t.Error
		}
		vm.Steps = append(vm.Steps, step)
	}
	stepOf := map[string]string{}
	for _, s := range v.Steps {
		stepOf[s.Key] = s.Name
	}
	for _, cr := range v.Calls {
		line := views.CallLine{At: cr.At.UTC().Format("15:04:05.000"), Kind: cr.Kind, System: cr.System,
			Step: cmp.Or(stepOf[cr.StepKey], cr.StepKey), Actor: cr.Actor, What: callText(cr)}
		if cr.Attempt != nil {
			line.Attempt = fmt.Sprintf(" · attempt %d", *cr.Attempt)
		}
		if cr.DeadlineAt != nil {
			line.Deadline = timeText(cr.DeadlineAt)
		}
		vm.Calls = append(vm.Calls, line)
	}
	for _, e := range v.Timeline {
		vm.Timeline = append(vm.Timeline, views.TimelineEvent{
			At: e.At.UTC().Format("15:04:05.000"), From: deref(e.FromStatus), To: e.ToStatus, Step: deref(e.Step),
			Actor: e.Actor, Owner: shortToken(deref(e.OwnerToken)), Detail: e.Detail, Statement: strings.TrimSpace(e.Statement),
		})
	}
	return vm, nil
}

// callText says what one exchange was.
func callText(c workflow.CallRecord) string {
	switch c.Kind {
	case "call":
		return "sent " + c.StepKey + " " + string(c.Request)
	case "answer":
		s := "answer: " + deref(c.Outcome)
		if c.Truth != nil {
			s += " (" + *c.Truth + ")"
		}
		if c.Detail != "" {
			s += " — " + c.Detail
		}
		if c.TookMS != nil {
			s += fmt.Sprintf(", after %d ms", *c.TookMS)
		}
		return s
	default:
		s := "status of " + c.StepKey + ": "
		if c.Truth != nil {
			s += *c.Truth
		} else {
			s += "could not be asked — " + c.Detail
		}
		return s
	}
}

// releasedText says why a live operation's lease ended early.
func releasedText(r string) string {
	switch r {
	case workflow.ReleasedHandedOver:
		return "handed to recovery on purpose"
	case workflow.ReleasedBackedOff:
		return "released: backing off"
	case workflow.ReleasedRetryRequested:
		return "handed back to recovery by a person"
	}
	return ""
}

func prettyJSON(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
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
