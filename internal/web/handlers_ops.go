package web

import (
	"context"
	"io/fs"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/views"
)

func (app *App) handleHealthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok", "instance": app.cfg.InstanceID})
}

// handleReadyz answers 200 only when the database answers and the schema is
// at the version this binary carries; a load balancer sends no traffic until
// then.
func (app *App) handleReadyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := app.pool.Ping(ctx); err != nil {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "database unreachable"})
	}
	if err := app.migrator.CheckCurrent(ctx); err != nil {
		return c.JSON(http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": err.Error()})
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

// handleFavicon: GET /favicon.ico — browsers ask for it on every page
// whatever the <link rel=icon> says; without it every page logs a 404.
func handleFavicon(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "public, max-age=86400")
	b, err := fs.ReadFile(views.Static, "favicon.ico")
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, "image/x-icon", b)
}
