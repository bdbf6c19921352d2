package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/recovery"
)

// handleListSystems: GET /api/v1/admin/systems — what the app believes
// about each external system's idempotency, and who set it when.
func (app *App) handleListSystems(c echo.Context) error {
	list, err := recovery.Beliefs(c.Request().Context(), app.pool)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": list})
}

// systemBody is the JSON of PUT /api/v1/admin/systems/{name}.
type systemBody struct {
	BelievedIdempotent *bool `json:"believed_idempotent"`
}

// handlePutSystem: PUT /api/v1/admin/systems/:name {"believed_idempotent":
// bool} — from now on recovery decides with this belief. Setting a value
// is idempotent by nature, so the route takes no Idempotency-Key. 404 for
// a system the app does not call.
func (app *App) handlePutSystem(c echo.Context) error {
	var in systemBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	if in.BelievedIdempotent == nil {
		return refuse(errValidation, "Missing belief",
			"believed_idempotent must be true or false").With("field", "believed_idempotent")
	}
	u, _ := userFrom(c)
	b, err := recovery.SetBelief(c.Request().Context(), app.pool, c.Param("name"), *in.BelievedIdempotent,
		u.Name+" (admin, "+app.actor(c)+")")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, b)
}
