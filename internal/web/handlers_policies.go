package web

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// handleListPolicies: GET /api/v1/policies?status=&limit=&cursor=
func (app *App) handleListPolicies(c echo.Context) error {
	u, _ := userFrom(c)
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && status != policies.StatusActive && status != policies.StatusCancelled {
		return invalidParam("status", "status must be ACTIVE or CANCELLED")
	}
	rows, err := app.policies.List(c.Request().Context(), policies.ListFilter{
		UserID: u.ID, Status: status, AfterID: lp.AfterID, Limit: lp.Limit + 1,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newListPage(rows, lp.Limit, func(p policies.Policy) int64 { return p.ID }))
}

// handleGetPolicy: GET /api/v1/policies/:id — 404 for another customer's.
func (app *App) handleGetPolicy(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	p, err := app.policies.Get(c.Request().Context(), u.ID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

func (app *App) handlePoliciesPage(c echo.Context) error {
	u, _ := userFrom(c)
	list, err := app.policies.List(c.Request().Context(), policies.ListFilter{UserID: u.ID, Limit: maxLimit})
	if err != nil {
		return err
	}
	rows := make([]views.PolicyRow, len(list))
	for i, p := range list {
		rows[i] = views.PolicyRow{ID: p.ID, Number: p.Number, Holder: p.Holder, Premium: p.Premium, Status: p.Status}
	}
	return render(c, http.StatusOK, views.PoliciesPage(app.page(c, "Policies", "policies"), rows))
}

// cancelBody is the optional JSON body of POST /api/v1/policies/{id}/cancel.
type cancelBody struct {
	Reason string `json:"reason"`
}

// handleCancelPolicy: POST /api/v1/policies/:id/cancel (Idempotency-Key).
// 200 SUCCEEDED · 202 IN_PROGRESS + Location (outcome unknown; recovery
// finishes it) · 422 provider-rejected · 409 duplicate-intent · 404.
func (app *App) handleCancelPolicy(c echo.Context) error {
	var in cancelBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err // refused before the workflow: nothing claimed, nothing stored
	}
	return app.cancelPolicy(c, in.Reason, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return cancelAnswer(c, op)
	})
}

// handleCancelPolicyForm: POST /policies/:id/cancel (form, hidden
// idempotency_key). Whatever the outcome, the answer is a redirect to the
// operation page (POST/redirect/GET), stored with the outcome, so a
// double-click or a reload of the POST lands on the same page.
func (app *App) handleCancelPolicyForm(c echo.Context) error {
	return app.cancelPolicy(c, c.FormValue("reason"), func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		var dup *policies.DuplicateIntentError
		switch {
		case errors.As(refusal, &dup):
			// Another click with another key got there first: show its operation.
			return redirectAnswer(fmt.Sprintf("/operations/%d?notice=duplicate-intent", dup.OperationID))
		case refusal != nil:
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(fmt.Sprintf("/operations/%d", op.ID))
	})
}

// cancelPolicy is the one call both cancel handlers make; they differ only
// in how they answer.
func (app *App) cancelPolicy(c echo.Context, reason string, answer answerer[workflow.Operation]) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	if err := validText("reason", reason, maxTextLength); err != nil {
		return err
	}
	ctx := c.Request().Context()
	req := policies.CancelRequest{
		UserID: u.ID, PolicyID: id, Reason: reason, RequestKey: idempotency.AttemptFrom(ctx).KeyOrEmpty(), Actor: app.actor(c),
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := app.canceller.Cancel(ctx, req, hooks)
		return err
	})
}

// cancelAnswer is the API's answer for an operation as committed, as its
// caller may read it (operationFor, redact.go).
func cancelAnswer(c echo.Context, op workflow.Operation) (idempotency.Response, error) {
	op = operationFor(c, op)
	switch op.Status {
	case workflow.StatusSucceeded:
		return idempotency.JSONResponse(http.StatusOK, op)
	case workflow.StatusFailed:
		reason := ""
		if op.LastError != nil {
			reason = *op.LastError
		}
		p, _ := toProblem(refuse(errProviderRejected, "The provider refused the cancellation", reason).
			With("operation_id", op.ID).With("operation_url", operationURL(op.ID)))
		return problemResponse(p)
	default: // IN_PROGRESS: the outcome is unknown; it is not a failure
		resp, err := idempotency.JSONResponse(http.StatusAccepted, op)
		resp.Header.Set(echo.HeaderLocation, operationURL(op.ID))
		return resp, err
	}
}

func operationURL(id int64) string { return fmt.Sprintf("/api/v1/operations/%d", id) }

// handlePolicyPage: GET /policies/:id — the policy and its cancel form.
func (app *App) handlePolicyPage(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	p, err := app.policies.Get(ctx, u.ID, id)
	if err != nil {
		return err
	}
	vm := views.PolicyDetail{ID: p.ID, Number: p.Number, Holder: p.Holder, Premium: p.Premium, Status: p.Status, CancelKey: newFormKey()}
	op, err := app.engine.OperationOf(ctx, policies.OperationCancel, p.ID)
	switch {
	case err == nil:
		vm.OperationID, vm.OperationStatus = op.ID, op.Status
	case !errors.Is(err, workflow.ErrNotFound):
		return err
	}
	vm.CanCancel = p.Status == policies.StatusActive && (vm.OperationID == 0 || op.Status == workflow.StatusFailed)
	return render(c, http.StatusOK, views.PolicyPage(app.page(c, p.Number, "policies"), vm))
}
