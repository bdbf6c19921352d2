package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/a-h/templ"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// This file is where the request's Idempotency-Key meets the workflows.
// The middleware (idempotency.Middleware) validates the key and replays
// answers; respond hands the workflow the hooks that claim the key in its
// first transaction and store the answer in the transaction that decides it.

// answerer is how one action's outcome becomes the answer stored with the key:
// the result, or the business refusal the workflow committed. The API and
// the form handler of an action differ only in their render.
type answerer[T any] func(c echo.Context, result T, refusal error) (idempotency.Response, error)

// respond runs one keyed workflow call and sends its answer — exactly the
// answer stored with the key, so the first answer and every replay are the
// same bytes. run gets the hooks to pass to the workflow.
//
// When the workflow failed (nothing was committed), the error goes to the
// error handler, except for a lost lease: then this request answers nothing
// of its own, and the middleware answers what the key holds.
func respond[T any](c echo.Context, answer answerer[T], run func(workflow.Hooks[T]) error) error {
	var (
		claim  *idempotency.Claim
		stored idempotency.Response
	)
	err := run(workflow.Hooks[T]{
		Begin: func(ctx context.Context, tx pgx.Tx) error {
			var err error
			claim, err = idempotency.AttemptFrom(ctx).Claim(ctx, tx)
			return err
		},
		Finish: func(ctx context.Context, tx pgx.Tx, result T, refusal error) error {
			var err error
			if stored, err = answer(c, result, refusal); err != nil {
				return err
			}
			return claim.Complete(ctx, tx, stored)
		},
	})
	switch {
	case err == nil, workflow.IsRefused(err):
		return stored.Write(c) // committed with the outcome
	case errors.Is(err, workflow.ErrLeaseLost):
		// Someone took the operation over while this request waited on the
		// provider: the outcome is theirs to record, and the key's answer
		// is whatever it holds now.
		return fmt.Errorf("%w: %w", idempotency.ErrLeaseLost, err)
	default:
		return err
	}
}

// problemAnswer is a refusal as the API answers it: the problem+json the
// error table gives, byte for byte what the error handler would write.
func problemAnswer(c echo.Context, refusal error) (idempotency.Response, error) {
	p, known := toProblem(refusal)
	if !known {
		return idempotency.Response{}, refusal // not a refusal this layer can word: fail
	}
	p.Instance = c.Request().URL.Path
	return problemResponse(p)
}

// problemResponse is p as a stored answer: the bytes problem.Write sends.
func problemResponse(p *problem.Problem) (idempotency.Response, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{
		Status: p.Status,
		Header: http.Header{echo.HeaderContentType: {problem.ContentType}},
		Body:   append(body, '\n'),
	}, nil
}

// pageAnswer renders a page as a stored answer (a form's refusal in words).
func pageAnswer(c echo.Context, status int, page templ.Component) (idempotency.Response, error) {
	var buf bytes.Buffer
	if err := page.Render(c.Request().Context(), &buf); err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{
		Status: status,
		Header: http.Header{echo.HeaderContentType: {echo.MIMETextHTMLCharsetUTF8}},
		Body:   buf.Bytes(),
	}, nil
}

// refusalPage is a form's answer to a refusal it has no notice for: the
// error page the error handler would show, stored like any answer.
func (app *App) refusalPage(c echo.Context, refusal error) (idempotency.Response, error) {
	p, known := toProblem(refusal)
	if !known {
		return idempotency.Response{}, refusal
	}
	return pageAnswer(c, p.Status, views.ErrorPage(app.page(c, http.StatusText(p.Status), ""), p.Status, p.Detail))
}

// redirectAnswer is a form's usual answer: 303 See Other (POST/redirect/GET).
func redirectAnswer(location string) (idempotency.Response, error) {
	return idempotency.RedirectResponse(http.StatusSeeOther, location), nil
}

// idempotentAPI wraps a JSON route in the Idempotency-Key protocol. The
// key's scope is the caller: one user can never replay another's answer.
func (app *App) idempotentAPI() echo.MiddlewareFunc {
	return idempotency.Middleware(app.idempotency, idempotency.Config{
		Scope:  userScope,
		Logger: app.logger,
	})
}

// idempotentForm wraps a browser form route: the key is the hidden
// idempotency_key field minted when the form was rendered. A double-click
// waits briefly for the first click's answer (a redirect) instead of
// showing "still processing"; refusals are pages, not problem+json.
func (app *App) idempotentForm() echo.MiddlewareFunc {
	return idempotency.Middleware(app.idempotency, idempotency.Config{
		KeyFrom:      idempotency.FromFormField,
		Scope:        userScope,
		WaitInFlight: 3 * time.Second,
		HTML:         app.formNotice,
		Logger:       app.logger,
	})
}

func userScope(c echo.Context) (int64, bool) {
	u, ok := userFrom(c)
	return u.ID, ok
}

// formNotice explains a refused form submission in words.
func (app *App) formNotice(c echo.Context, refusal *idempotency.Refusal) error {
	p, _ := toProblem(refusal)
	n := views.Notice{Title: p.Title, Message: p.Detail, Back: c.Request().Referer(), BackLabel: "Back"}
	switch p.Type {
	case "request-in-progress":
		// The app cannot tell a first submission still running from one
		// whose process died: both hold the key's lease, and only the lease
		// running out tells them apart. Say what is true of both.
		n.Title = "Your first submission still holds this form"
		u, _ := userFrom(c)
		n.Message = inProgressMessage(u.IsAdmin())
	case "idempotency-key-reused":
		n.Title = "This form was already used"
		n.Message = "This form was already submitted with different values. Reload the page to get a fresh form."
	case "idempotency-key-missing", "idempotency-key-malformed":
		n.Title = "This form cannot be sent"
		n.Message = "The form is missing its one-time key. Reload the page and try again."
	}
	if n.Back == "" {
		n.Back, n.BackLabel = "/", "Home"
	}
	return render(c, p.Status, views.NoticePage(app.page(c, n.Title, ""), n))
}

// inProgressMessage says why a form's repeat waits, true whether the first
// submission runs or died: to an admin with the key's lease, to a customer
// in a customer's words (redact.go: the lease is the operators' word).
func inProgressMessage(admin bool) string {
	if admin {
		return "This form was already submitted, and that first submission holds the form's key until it finishes — or, if it stopped without finishing (a crash), until its lease runs out. It will not run twice. Try again after that: a retry then gets its answer, or takes over and finishes it. Or open the page again later to see the result."
	}
	return "This form was already submitted, and that first submission is still being dealt with — if it was cut off, the app picks it up again after a short wait. It will not run twice. Try again in a little while: you then get its answer. Or open the page again later to see the result."
}

// newFormKey mints the idempotency key a form carries: 128 random bits.
func newFormKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// actor names the current request in operation timelines.
func (app *App) actor(c echo.Context) string {
	return "request " + c.Response().Header().Get(echo.HeaderXRequestID) + " on " + app.cfg.InstanceID
}
