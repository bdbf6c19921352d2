package main

import (
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemlab/idemlab/views"
)

// routes lists every URL idemlab serves, with the middleware each needs.
func (app *application) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = app.handleError

	// Every request: an id, a log line, panic recovery, metrics, a body
	// limit, secure headers.
	e.Use(middleware.RequestID(), app.logRequests, recoverPanics(), app.metrics.measure,
		middleware.BodyLimit(app.cfg.BodyLimit), secureHeaders())

	// Operations.
	e.GET("/healthz", app.handleHealthz) // the process is up
	e.GET("/readyz", app.handleReadyz)   // the database answers and the schema is current
	e.GET("/metrics", app.metrics.handler())
	e.StaticFS("/static", views.Static) // vendored htmx and Pico, app.css, app.js

	// JSON API: bearer tokens, no cookies, so no CSRF.
	api := e.Group("/api/v1", app.authenticateBearer)
	api.GET("/policies", app.handleListPolicies)                                                   // the caller's policies, ?status=, paginated
	api.GET("/policies/:id", app.handleGetPolicy)                                                  // one of the caller's policies
	api.GET("/slots", app.handleListSlots)                                                         // every slot, ?status=, paginated
	api.GET("/users", app.handleListUsers, requireAdmin)                                           // every account (admin)
	api.POST("/policies/:id/cancel", app.handleCancelPolicy, app.idempotentAPI(), translateErrors) // cancel (Idempotency-Key)
	api.GET("/operations/:id", app.handleGetOperation)                                             // status, steps, timeline, provider truth

	// The fake provider's controls (admin). No Idempotency-Key: they set up a
	// test double, and PUT and reset are idempotent by nature (docs/api.md).
	api.GET("/admin/crash", app.handleGetCrash, requireAdmin)                // the crash point armed on this instance
	api.PUT("/admin/crash", app.handlePutCrash, requireAdmin)                // arm or disarm a crash point (labs, tests)
	api.GET("/provider/faults", app.handleGetProviderFaults, requireAdmin)   // the whole fault configuration
	api.PUT("/provider/faults", app.handlePutProviderFaults, requireAdmin)   // set one fault: global, override or script entry
	api.GET("/provider/effects", app.handleGetProviderEffects, requireAdmin) // the effects ledger, per policy
	api.POST("/provider/reset", app.handleResetProvider, requireAdmin)       // forget everything, default faults

	// Browser pages: a signed session cookie, and CSRF on every form.
	page := []echo.MiddlewareFunc{app.loadSession, csrfProtection()}
	signedIn := append(page[:len(page):len(page)], requireSignIn)
	e.GET("/", app.handleHome, page...)                     // what each part demonstrates
	e.GET("/signin", app.handleSignInPage, page...)         // "sign in as" a demo user
	e.POST("/signin", app.handleSignIn, page...)            // sets the session cookie
	e.POST("/signout", app.handleSignOut, page...)          // clears it
	e.GET("/policies", app.handlePoliciesPage, signedIn...) // your policies
	e.GET("/slots", app.handleSlotsPage, signedIn...)       // the slots grid
	e.GET("/provider", app.handleProviderPage, signedIn...) // the fake provider: faults, ledger, what each mode means

	// Forms that change business state go through the idempotency protocol,
	// keyed by the hidden idempotency_key field minted when the form rendered.
	keyedForm := append(signedIn[:len(signedIn):len(signedIn)], app.idempotentForm(), translateErrors)
	e.GET("/policies/:id", app.handlePolicyPage, signedIn...)                   // one policy and its cancel form
	e.POST("/policies/:id/cancel", app.handleCancelPolicyForm, keyedForm...)    // cancel, then redirect to the operation
	e.POST("/policies/:id/double-click", app.handleDoubleClickLab, signedIn...) // the double-click lab: two submissions at once
	e.GET("/operations/:id", app.handleOperationPage, signedIn...)              // local state vs provider truth, timeline
	e.GET("/operations/:id/panel", app.handleOperationPanel, signedIn...)       // the same panel, for htmx polling

	adminOnly := append(signedIn[:len(signedIn):len(signedIn)], requireAdmin)
	e.POST("/provider/faults", app.handleProviderFaultsForm, adminOnly...) // the page's fault forms (admin)
	e.POST("/provider/reset", app.handleProviderResetForm, adminOnly...)   // the page's reset button (admin)
	return e
}
