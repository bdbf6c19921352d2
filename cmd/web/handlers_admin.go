package main

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/problem"
)

// handleGetCrash: GET /api/v1/admin/crash — the crash point in force.
func (app *application) handleGetCrash(c echo.Context) error {
	return c.JSON(http.StatusOK, app.crash.get())
}

// handlePutCrash: PUT /api/v1/admin/crash {"at": "after_provider_call",
// "mode": "abandon", "once": true} — arm a crash point on this instance
// ({"at": ""} disarms it). Setting a value is idempotent by nature, so the
// route takes no Idempotency-Key.
func (app *application) handlePutCrash(c echo.Context) error {
	var s crashSetting
	if err := decodeOptionalJSON(c, &s); err != nil {
		return err
	}
	if err := app.crash.set(s); err != nil {
		return problem.New(http.StatusBadRequest, "invalid-crash-point", "Invalid crash point", err.Error())
	}
	return c.JSON(http.StatusOK, app.crash.get())
}
