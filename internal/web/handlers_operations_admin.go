package web

import (
	"fmt"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
)

// An admin's actions on one operation, beside the desk's decisions: keyed
// like every write (the run answers the key), fenced like every write (the
// engine's start restarts the operation only while it is FAILED), and
// recorded in the operation's timeline with the admin and the request as
// the actor.

// resume runs operations.Resume for the path's operation.
func (app *App) resume(c echo.Context, answer answerer[workflow.Operation]) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	ctx := c.Request().Context()
	req := operations.ResumeRequest{
		OperationID: id,
		RequestKey:  idempotency.AttemptFrom(ctx).KeyOrEmpty(),
		Actor:       fmt.Sprintf("%s (%s)", u.Name, app.actor(c)),
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := operations.Resume(ctx, app.engine, req, hooks)
		return err
	})
}

// handleResumeAPI: POST /api/v1/admin/operations/:id/resume (admin,
// Idempotency-Key). 200 the operation (SUCCEEDED) · 202 + Location (an
// outcome unknown again: recovery finishes it) · 422 provider-rejected
// (refused again) · 409 not-failed · 409 resume-not-allowed · 404.
func (app *App) handleResumeAPI(c echo.Context) error {
	return app.resume(c, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		switch {
		case refusal != nil:
			return problemAnswer(c, refusal)
		case op.Type == slots.OperationCancelDeposit && op.Status == workflow.StatusFailed:
			// refused again, as the booking's own cancellation words it
			p, _ := toProblem(slots.ErrRefundRefused)
			p.Instance = c.Request().URL.Path
			return problemResponse(p.With("operation_id", op.ID).With("operation_url", operationURL(op.ID)))
		}
		return cancelAnswer(c, op)
	})
}

// handleResumeForm: POST /operations/:id/resume (admin form, hidden
// idempotency_key): back to the operation's page, whatever happened; a
// refusal is a page in words.
func (app *App) handleResumeForm(c echo.Context) error {
	return app.resume(c, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(fmt.Sprintf("/operations/%d", op.ID))
	})
}

// resumeRule says, in words for the operation page, why an admin may not
// resume a FAILED operation of type typ ("" when they may).
func resumeRule(typ string) string {
	if !operations.Resumable[typ] {
		return "A failed deposit booking is not resumed: its hold was released when the charge was refused, and the slot may be booked by someone else since. The customer books again."
	}
	return ""
}
