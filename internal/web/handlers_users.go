package web

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// handleListUsers: GET /api/v1/users (admin) — every account, for scripts
// that drive the API as several users.
func (app *App) handleListUsers(c echo.Context) error {
	list, err := app.users.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"items": list})
}
