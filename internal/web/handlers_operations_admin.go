package web

import (
	"fmt"
	"time"

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
		ClockSkew:   app.recovery.Settings().Budget().ClockSkew,
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

// retryBody is the JSON of POST /api/v1/admin/operations/:id/retry-from.
type retryBody struct {
	Step          string    `json:"step"`            // the step to retry from: the one the operation stopped at
	SeenUpdatedAt time.Time `json:"seen_updated_at"` // the operation's updated_at as the admin saw it
	Note          string    `json:"note"`            // why, in their words (optional)
}

// retryFrom checks in's fields and runs operations.RetryFrom for the
// path's operation.
func (app *App) retryFrom(c echo.Context, in retryBody, answer answerer[workflow.Operation]) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	switch {
	case in.Step == "" || len(in.Step) > 64:
		return refuse(errValidation, "Missing step", "step must name the step to retry from (the one the operation stopped at)").With("field", "step")
	case in.SeenUpdatedAt.IsZero():
		return refuse(errValidation, "Missing state", "seen_updated_at must be the operation's updated_at as you saw it").With("field", "seen_updated_at")
	}
	if err := validText("step", in.Step, 64); err != nil {
		return err
	}
	if err := validText("note", in.Note, maxTextLength); err != nil {
		return err
	}
	u, _ := userFrom(c)
	ctx := c.Request().Context()
	req := operations.RetryRequest{
		OperationID: id, Step: in.Step, SeenUpdatedAt: in.SeenUpdatedAt, Note: in.Note,
		RequestKey: idempotency.AttemptFrom(ctx).KeyOrEmpty(),
		Actor:      fmt.Sprintf("%s (%s)", u.Name, app.actor(c)),
		DecidedBy:  u.Name,
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := operations.RetryFrom(ctx, app.engine, req, hooks)
		return err
	})
}

// handleRetryFromAPI: POST /api/v1/admin/operations/:id/retry-from (admin,
// Idempotency-Key; body step, seen_updated_at, note). 200 the operation
// SUCCEEDED · 202 + Location (an outcome unknown again: recovery finishes
// it) · 409 retry-refused-again (the retried step refused again: FAILED, or
// waiting for a person) · 409 for each unsafe retry (errors.go) · 404.
func (app *App) handleRetryFromAPI(c echo.Context) error {
	if _, err := pathID(c, "id"); err != nil {
		return err // a bad id is 404 whatever the body
	}
	var in retryBody
	if err := decodeJSON(c, &in); err != nil {
		return err
	}
	return app.retryFrom(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		switch {
		case refusal != nil:
			return problemAnswer(c, refusal)
		case op.Status == workflow.StatusFailed || op.Status == workflow.StatusNeedsReconciliation:
			p, _ := toProblem(refuse(errRetryRefusedAgain, "", fmt.Sprintf("the retried step was refused again: the operation is %s", op.Status)).
				With("operation_id", op.ID).With("operation_status", op.Status).With("operation_url", operationURL(op.ID)))
			p.Instance = c.Request().URL.Path
			return problemResponse(p)
		}
		return cancelAnswer(c, op)
	})
}

// handleRetryFromForm: POST /operations/:id/retry-from (admin form, hidden
// idempotency_key, step and seen_updated_at): back to the operation's page,
// whatever the retry led to; a refusal is a page in words.
func (app *App) handleRetryFromForm(c echo.Context) error {
	seen, err := time.Parse(time.RFC3339Nano, c.FormValue("seen_updated_at"))
	if err != nil {
		return refuse(errInvalidParameter, "Invalid form", "the form lacks the state it was shown for; reload the page")
	}
	in := retryBody{Step: c.FormValue("step"), SeenUpdatedAt: seen, Note: c.FormValue("note")}
	return app.retryFrom(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(fmt.Sprintf("/operations/%d", op.ID))
	})
}
