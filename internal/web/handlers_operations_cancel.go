package web

import (
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
)

// cancelOperation runs operations.Cancel for the path's operation.
func (app *App) cancelOperation(c echo.Context, answer answerer[workflow.Operation]) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	ctx := c.Request().Context()
	req := operations.CancelRequest{
		OperationID: id,
		Actor:       fmt.Sprintf("%s (%s)", u.Name, app.actor(c)),
		DecidedBy:   u.Name,
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := operations.Cancel(ctx, app.engine, app.pool, req, hooks)
		return err
	})
}

// handleCancelOperationAPI: POST /api/v1/operations/:id/cancel (admin,
// Idempotency-Key). 202 the operation as marked + Location (it stops
// before its next step; the outcome comes later: Prefer: wait, or GET it) ·
// 409 not-live (finished, or waiting for a person) · 409
// cancel-already-requested · 404.
func (app *App) handleCancelOperationAPI(c echo.Context) error {
	return app.cancelOperation(c, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		resp, err := idempotency.JSONResponse(http.StatusAccepted, op)
		resp.Header.Set(echo.HeaderLocation, operationURL(op.ID))
		return resp, err
	})
}

// handleCancelOperationForm: POST /operations/:id/cancel (admin form, hidden
// idempotency_key): back to the operation's page; a refusal is a page in
// words.
func (app *App) handleCancelOperationForm(c echo.Context) error {
	return app.cancelOperation(c, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(fmt.Sprintf("/operations/%d", op.ID))
	})
}

// cancelLabel is the word before cancelState: "Cancelled." only once the
// operation has stopped (FAILED); before that a cancel is only asked for.
func cancelLabel(op workflow.Operation) string {
	switch {
	case op.CancelRequestedAt == nil:
		return ""
	case op.Status == workflow.StatusFailed:
		return "Cancelled."
	case op.Status == workflow.StatusSucceeded:
		return "Not cancelled."
	}
	return "Cancel requested."
}

// cancelState says, in words a customer understands, where a cancel of op
// stands ("" when nobody asked for one).
func cancelState(op workflow.Operation) string {
	if op.CancelRequestedAt == nil {
		return ""
	}
	compensating, cancelledSteps := false, false
	for _, s := range op.Steps {
		switch {
		case s.State == workflow.StepCancelled:
			cancelledSteps = true
		case cancelledSteps:
			compensating = true
		}
	}
	switch {
	case op.Status == workflow.StatusFailed && compensating:
		return "It was stopped after the other system had already done its part, and that part was undone: any money taken was refunded."
	case op.Status == workflow.StatusFailed:
		return "It was stopped before anything was done at another system. Nothing was charged or changed."
	case op.Status == workflow.StatusNeedsReconciliation:
		return "It was asked to stop, but " + cancelledTooLate
	case op.Status == workflow.StatusSucceeded:
		return "It was asked to stop too late: it had already finished."
	case compensating:
		return "It was asked to stop after the other system had already done its part, so that part is being undone now (a payment is refunded)."
	}
	if op.Type == slots.OperationBookDeposit { // the one definition with a Compensation (docs/workflows.md)
		return "It was asked to stop. It stops before its next step; if a request to another system is already on its way, its answer is awaited first, and if it went through, that part is undone (a deposit charged is refunded)."
	}
	// No Compensation (a policy the provider cancelled): a cancel after an
	// effect goes to a person, in the same words as once it is there.
	return "It was asked to stop. It stops before its next step; if a request to another system is already on its way, its answer is awaited first. " +
		"If it went through, " + cancelledTooLate
}

// cancelledTooLate is what a cancel after another system's effect does to an
// operation whose definition has no Compensation: the one truth the notice
// after pressing Cancel and the page afterwards both tell.
const cancelledTooLate = "the other system has done its part and that cannot be undone automatically: it waits for a person on the reconciliation desk."
