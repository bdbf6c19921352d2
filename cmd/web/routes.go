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
	api.GET("/policies", app.handleListPolicies)                                                                        // the caller's policies, ?status=, paginated
	api.GET("/policies/:id", app.handleGetPolicy)                                                                       // one of the caller's policies
	api.GET("/slots", app.handleListSlots)                                                                              // every slot, ?status=, paginated
	api.GET("/users", app.handleListUsers, requireAdmin)                                                                // every account (admin)
	api.POST("/policies/:id/cancel", app.handleCancelPolicy, app.idempotentAPI(), translateErrors)                      // cancel (Idempotency-Key)
	api.GET("/operations/:id", app.handleGetOperation)                                                                  // status, steps, timeline, provider truth
	api.GET("/recovery", app.handleRecoveryAPI)                                                                         // counts, live operations, recent recovery steps
	api.GET("/admin/reconciliation", app.handleReconciliationAPI, requireAdmin)                                         // operations that need a person (admin)
	api.POST("/admin/operations/:id/resolve", app.handleResolveAPI, requireAdmin, app.idempotentAPI(), translateErrors) // a person's decision (admin, Idempotency-Key)

	// Browser pages: a signed session cookie, and CSRF on every form.
	page := []echo.MiddlewareFunc{app.loadSession, csrfProtection()}
	signedIn := append(page[:len(page):len(page)], requireSignIn)
	e.GET("/", app.handleHome, page...)                                                                                    // what each part demonstrates
	e.GET("/signin", app.handleSignInPage, page...)                                                                        // "sign in as" a demo user
	e.POST("/signin", app.handleSignIn, page...)                                                                           // sets the session cookie
	e.POST("/signout", app.handleSignOut, page...)                                                                         // clears it
	e.GET("/policies", app.handlePoliciesPage, signedIn...)                                                                // your policies
	e.GET("/slots", app.handleSlotsPage, signedIn...)                                                                      // the slots grid
	e.GET("/policies/:id", app.handlePolicyPage, signedIn...)                                                              // a policy and its cancel form
	e.POST("/policies/:id/cancel", app.handleCancelPolicyForm, append(signedIn, app.idempotentForm(), translateErrors)...) // cancel (hidden idempotency_key)
	e.GET("/operations/:id", app.handleOperationPage, signedIn...)                                                         // local state, provider truth, timeline
	e.GET("/operations/:id/panel", app.handleOperationPanel, signedIn...)                                                  // its htmx partial
	e.GET("/recovery", app.handleRecoveryPage, page...)                                                                    // the recovery loops at work (everyone)
	e.GET("/recovery/panel", app.handleRecoveryPanel, page...)                                                             // its htmx partial
	admin := append(signedIn[:len(signedIn):len(signedIn)], requireAdmin)
	e.GET("/reconciliation", app.handleReconciliationPage, admin...)                                                      // operations that need a person (admin)
	e.POST("/reconciliation/:id/resolve", app.handleResolveForm, append(admin, app.idempotentForm(), translateErrors)...) // a decision (keyed form)
	return e
}
