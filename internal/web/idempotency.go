package web

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/views"
)

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
func (app *App) formNotice(c echo.Context, p *problem.Problem) error {
	n := views.Notice{Title: p.Title, Message: p.Detail, Back: c.Request().Referer(), BackLabel: "Back"}
	switch p.Type {
	case "request-in-progress":
		n.Title = "Still working on your first click"
		n.Message = "This form was already submitted and the first submission is still being processed. It will not run twice. Wait a moment, then open the page again to see the result."
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
