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

	// Slots and bookings: contention (docs/booking.md).
	api.POST("/slots/:id/book", app.handleBookSlot, app.idempotentAPI(), translateErrors)           // 201 booking · 409 slot-taken (Idempotency-Key)
	api.GET("/bookings", app.handleListBookings)                                                    // the caller's bookings, ?status=, paginated
	api.GET("/bookings/:id", app.handleGetBooking)                                                  // one of the caller's bookings (any, for an admin)
	api.POST("/bookings/:id/cancel", app.handleCancelBooking, app.idempotentAPI(), translateErrors) // release: the slot is AVAILABLE again (Idempotency-Key)

	// Browser pages: a signed session cookie, and CSRF on every form.
	page := []echo.MiddlewareFunc{app.loadSession, csrfProtection()}
	signedIn := append(page[:len(page):len(page)], requireSignIn)
	e.GET("/", app.handleHome, page...)                     // what each part demonstrates
	e.GET("/signin", app.handleSignInPage, page...)         // "sign in as" a demo user
	e.POST("/signin", app.handleSignIn, page...)            // sets the session cookie
	e.POST("/signout", app.handleSignOut, page...)          // clears it
	e.GET("/policies", app.handlePoliciesPage, signedIn...) // your policies
	e.GET("/slots", app.handleSlotsPage, signedIn...)       // the slots grid

	// Booking from the grid (hidden idempotency_key per form), and the labs.
	slotForms := append(signedIn[:len(signedIn):len(signedIn)], app.idempotentForm(), translateErrors)
	e.POST("/slots/:id/book", app.handleBookSlotForm, slotForms...)           // book, then back to the grid
	e.POST("/bookings/:id/cancel", app.handleCancelBookingForm, slotForms...) // release, then back to the grid
	e.GET("/labs", app.handleLabsPage, signedIn...)                           // the list of labs
	e.GET("/labs/race", app.handleRaceLabPage, signedIn...)                   // the race lab
	e.POST("/labs/race", app.handleRunRace, signedIn...)                      // run a race (htmx swaps the result panel)
	return e
}
