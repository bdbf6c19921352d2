package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/views"
)

// routes lists every URL idemlab serves, with the middleware each needs.
func (app *App) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = app.handleError
	trustedProxies(e, app.cfg.TrustedProxies)

	// Every request, in this order: secure headers (on every answer, a
	// refusal too), an id, a log line, panic recovery, metrics, the body
	// read in full under its limit, and 405 for a method the path lacks.
	e.Use(secureHeaders, requestID, app.logRequests, recoverPanics(), app.metrics.measure,
		limitBody(app.bodyLimit), refuseOtherMethods)

	// Operations.
	e.GET("/healthz", app.handleHealthz) // the process is up
	e.GET("/readyz", app.handleReadyz)   // the database answers and the schema is current
	e.GET("/metrics", app.metrics.handler())
	e.StaticFS("/static", views.Static)          // vendored htmx and Pico, app.css, app.js
	e.GET("/static/code.css", app.handleCodeCSS) // the code viewer's highlighting
	e.GET("/favicon.ico", handleFavicon)         // the icon browsers ask for on every page
	if app.tasksPush != nil {
		// The task queue's pushes (EVENTS_TRANSPORT=tasks): its bearer
		// token, no session, no CSRF; the consumer rule answers.
		e.POST(events.PushPath+":consumer", echo.WrapHandler(app.tasksPush))
	}
	// Callbacks from the external systems: signed (HMAC, shared secret), no
	// session, no CSRF, no token; each event applied once (docs/provider.md).
	e.POST("/webhooks/:system", app.handleWebhook)

	// JSON API: bearer tokens, no cookies, so no CSRF.
	api := routeGroup{e: e, prefix: "/api/v1", middleware: []echo.MiddlewareFunc{app.authenticateBearer}}
	api.GET("/policies", app.handleListPolicies)                                                                                          // the caller's policies, ?status=, paginated
	api.GET("/policies/:id", app.handleGetPolicy)                                                                                         // one of the caller's policies
	api.GET("/slots", app.handleListSlots)                                                                                                // every slot, ?status=, paginated
	api.GET("/users", app.handleListUsers, requireAdmin)                                                                                  // every account (admin)
	api.POST("/policies/:id/cancel", app.handleCancelPolicy, app.answerWithOperationState, app.idempotentAPI())                           // cancel (Idempotency-Key)
	api.GET("/operations", app.handleListOperations)                                                                                      // every operation (admin) or the caller's own: filters, counts per status, paginated
	api.GET("/operations/:id", app.handleGetOperation)                                                                                    // status, steps, timeline, provider truth; Prefer: wait=N waits for a final state
	api.GET("/recovery", app.handleRecoveryAPI)                                                                                           // counts, live operations, recent recovery steps
	api.GET("/admin/reconciliation", app.handleReconciliationAPI, requireAdmin)                                                           // operations that need a person (admin)
	api.POST("/admin/operations/:id/resume", app.handleResumeAPI, requireAdmin, app.answerWithOperationState, app.idempotentAPI())        // a FAILED operation's next run (admin, Idempotency-Key)
	api.POST("/admin/operations/:id/retry-from", app.handleRetryFromAPI, requireAdmin, app.answerWithOperationState, app.idempotentAPI()) // retry a stopped operation from the step it stopped at, where safe (admin, Idempotency-Key)
	api.POST("/operations/:id/cancel", app.handleCancelOperationAPI, requireAdmin, app.answerWithOperationState, app.idempotentAPI())     // cancel a live operation: stops before its next step (admin, Idempotency-Key)
	api.POST("/admin/operations/:id/resolve", app.handleResolveAPI, requireAdmin, app.idempotentAPI())                                    // a person's decision (admin, Idempotency-Key)
	api.GET("/reconciliation", app.handleDeskAPI, requireAdmin)                                                                           // the desk: counts by reason and truth now, items with advice, ?reason= ?truth= (admin)
	api.GET("/reconciliation/decisions", app.handleDecisionsAPI, requireAdmin)                                                            // the audit trail of decisions, newest first (admin)
	api.POST("/reconciliation/decisions", app.handleDecisionsPostAPI, requireAdmin, app.idempotentAPI())                                  // bulk decisions, each conditional and unambiguous (admin, Idempotency-Key)
	api.POST("/reconciliation/ask", app.handleAskAPI, requireAdmin)                                                                       // ask the systems again; decides nothing (admin)
	api.GET("/reconciliation/items/:id", app.handleEvidenceAPI, requireAdmin)                                                             // one item's evidence: calls, answers, ledger, timeline, decisions (admin)
	api.GET("/events", app.handleEventsAPI, requireAdmin)                                                                                 // the outbox, dedupe per consumer and layer, recent events with deliveries (admin)
	api.GET("/mailbox", app.handleMailboxAPI)                                                                                             // the caller's messages from the notifications consumer
	api.GET("/admin/events/injector", app.handleGetInjectorAPI, requireAdmin)                                                             // the redelivery injector's script (admin)
	api.PUT("/admin/events/injector", app.handlePutInjectorAPI, requireAdmin)                                                             // replace it: {mode, consumer, count} (admin)
	api.POST("/admin/events/:id/replay", app.handleReplayAPI, requireAdmin, app.idempotentAPI())                                          // a dead letter back to the relay (admin, Idempotency-Key)
	api.GET("/labs", app.handleListLabsAPI)                                                                                               // every lab: what it teaches, its counts, its lines of code
	api.GET("/labs/:name/runs", app.handleListLabRunsAPI)                                                                                 // the caller's newest runs of a lab
	api.POST("/labs/:name/runs", app.handleRunLabAPI, app.limitLabs, app.idempotentAPI())                                                 // run a lab: broken, then correct (Idempotency-Key)
	api.GET("/labs/:name/runs/:id", app.handleGetLabRunAPI)                                                                               // one run: counts and timelines (the timeout lab's operations, live)

	// Lab controls (admin). No Idempotency-Key: they set up the experiment,
	// and setting a value or resetting is idempotent by nature (docs/api.md).
	api.GET("/invariants", app.handleInvariants, requireAdmin) // every invariant of docs/invariants.md, checked with SQL
	provider, payments := app.providerAdmin(), app.paymentsAdmin()
	api.GET("/provider/faults", provider.getFaults, requireAdmin)                // the fake provider's fault configuration
	api.PUT("/provider/faults", provider.putFaults, requireAdmin)                // set one fault: global, override or script entry
	api.GET("/provider/effects", app.handleGetProviderEffects, requireAdmin)     // the effects ledger, per policy, late arrivals
	api.POST("/provider/reset", provider.reset, requireAdmin)                    // forget everything, default faults
	api.GET("/payments/faults", payments.getFaults, requireAdmin)                // the fake payments service's fault configuration
	api.PUT("/payments/faults", payments.putFaults, requireAdmin)                // set one fault: global, override or script entry
	api.GET("/payments/ledger", app.handleGetPaymentsLedger, requireAdmin)       // every charge and refund, per subject, late arrivals
	api.POST("/payments/reset", payments.reset, requireAdmin)                    // forget everything, default faults
	api.GET("/provider/webhooks", app.handleGetWebhooks(provider), requireAdmin) // callbacks: the fake's setting and outbox, the app's inbox
	api.PUT("/provider/webhooks", provider.putWebhooks, requireAdmin)            // set how the provider calls back: {mode, delay_ms}
	api.GET("/payments/webhooks", app.handleGetWebhooks(payments), requireAdmin) // the same for payments
	api.PUT("/payments/webhooks", payments.putWebhooks, requireAdmin)            // set how payments calls back
	api.GET("/admin/systems", app.handleListSystems, requireAdmin)               // what the app believes about each external system
	api.PUT("/admin/systems/:name", app.handlePutSystem, requireAdmin)           // set that belief: {"believed_idempotent": bool}

	// Demo mode only (DEMO_MODE=true): without it these paths do not exist.
	if app.cfg.DemoMode {
		api.POST("/admin/reset", app.handleReset, requireAdmin)                       // wipe and reseed a dataset
		api.GET("/admin/crash", app.handleGetCrash, requireAdmin)                     // the crash point armed on this instance
		api.PUT("/admin/crash", app.handlePutCrash, requireAdmin)                     // arm or disarm a crash point
		api.POST("/admin/operations/:id/end-lease", app.handleEndLease, requireAdmin) // end a live operation's lease now: recovery claims it
	}

	// Slots and bookings: contention (docs/booking.md).
	api.POST("/slots/:id/book", app.handleBookSlot, app.answerWithOperationState, app.idempotentAPI())           // 201 booking · 409 slot-taken (Idempotency-Key)
	api.GET("/bookings", app.handleListBookings)                                                                 // the caller's bookings, ?status=, paginated
	api.GET("/bookings/:id", app.handleGetBooking)                                                               // one of the caller's bookings (any, for an admin)
	api.POST("/bookings/:id/cancel", app.handleCancelBooking, app.answerWithOperationState, app.idempotentAPI()) // release: the slot is AVAILABLE again (Idempotency-Key)

	// Browser pages: a server-side session (session.go), and a CSRF token
	// bound to it on every form.
	page := []echo.MiddlewareFunc{app.loadSession, app.csrfProtection}
	signedIn := append(page[:len(page):len(page)], requireSignIn, app.limitFormWrites)
	e.GET("/", app.handleHome, page...)                                                         // what each part demonstrates
	e.GET("/signin", app.handleSignInPage, page...)                                             // name and password, or "sign in as" in demo mode
	e.POST("/signin", app.handleSignIn, append(page[:len(page):len(page)], app.limitSignIn)...) // starts a session, sets its cookie
	e.POST("/signout", app.handleSignOut, page...)                                              // ends the session on the server
	e.GET("/policies", app.handlePoliciesPage, signedIn...)                                     // your policies
	e.GET("/slots", app.handleSlotsPage, signedIn...)                                           // the slots grid
	e.GET("/provider", app.handleProviderPage, signedIn...)                                     // the fake provider: faults, ledger, what each mode means
	e.GET("/payments", app.handlePaymentsPage, signedIn...)                                     // the fake payments service: faults, ledger, refunds by mode
	e.GET("/recovery", app.handleRecoveryPage, page...)                                         // the recovery loops at work (everyone)
	e.GET("/recovery/panel", app.handleRecoveryPanel, page...)                                  // its htmx partial
	e.GET("/code", redirectTo("/code/"), page...)                                               // the code viewer's top folder, as /docs leads to /docs/
	e.GET("/code/*", app.handleCodePage, page...)                                               // idemlab's own source, read-only: a file by line (#L120) or a folder
	e.GET("/ideas/retry-is-not-recovery", app.handleRetryNotRecovery, page...)                  // retry and recovery side by side, each with its pages
	e.GET("/ideas/crash-between-effect-and-record", app.handleCrashWindow, page...)             // what is durable, what recovery asks, why nothing runs twice
	e.GET("/docs", redirectTo("/docs/"), page...)                                               // the list of docs
	e.GET("/docs/", app.handleDocsIndex, page...)                                               // every document of the project, rendered
	e.GET("/docs/:name", app.handleDocPage, page...)                                            // one document ("recovery", "README"), its links into the docs and the code

	// Forms that change business state go through the idempotency protocol,
	// keyed by the hidden idempotency_key field minted when the form rendered.
	keyedForm := append(signedIn[:len(signedIn):len(signedIn)], app.idempotentForm())
	e.GET("/policies/:id", app.handlePolicyPage, signedIn...)                                                                        // one policy and its cancel form
	e.POST("/policies/:id/cancel", app.handleCancelPolicyForm, keyedForm...)                                                         // cancel, then redirect to the operation
	e.POST("/policies/:id/double-click", app.handleDoubleClickLab, append(signedIn[:len(signedIn):len(signedIn)], app.limitLabs)...) // the double-click lab: two submissions at once
	e.GET("/operations", app.handleOperationsPage, signedIn...)                                                                      // the operations list: counts per status, filters, newest first
	e.GET("/operations/:id", app.handleOperationPage, signedIn...)                                                                   // local state vs provider truth, timeline
	e.GET("/operations/:id/panel", app.handleOperationPanel, signedIn...)                                                            // the same panel, for htmx polling

	adminOnly := append(signedIn[:len(signedIn):len(signedIn)], requireAdmin)
	e.POST("/provider/faults", provider.faultsForm, adminOnly...)            // the provider page's fault forms (admin)
	e.POST("/provider/reset", provider.resetForm, adminOnly...)              // the provider page's reset button (admin)
	e.POST("/payments/faults", payments.faultsForm, adminOnly...)            // the payments page's fault forms (admin)
	e.POST("/payments/reset", payments.resetForm, adminOnly...)              // the payments page's reset button (admin)
	e.POST("/provider/webhooks", provider.webhooksForm, adminOnly...)        // the provider page's callback mode (admin)
	e.POST("/payments/webhooks", payments.webhooksForm, adminOnly...)        // the payments page's callback mode (admin)
	e.GET("/reconciliation", app.handleReconciliationPage, adminOnly...)     // operations that need a person (admin)
	e.GET("/reconciliation/badge", app.handleReconcileBadge, adminOnly...)   // the nav's live count (htmx partial, admin)
	e.GET("/reconciliation/items/:id", app.handleEvidencePage, adminOnly...) // one item's evidence and decisions (admin)
	e.POST("/reconciliation/ask", app.handleAskForm, adminOnly...)           // ask again, one item or all shown (admin)
	e.GET("/events", app.handleEventsPage, signedIn...)                      // the outbox, deliveries, dedupe, ledger, your mailbox
	e.POST("/events/injector", app.handleInjectorForm, adminOnly...)         // arm the redelivery injector (admin)
	e.POST("/events/:id/replay", app.handleReplayForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // replay a dead letter (keyed form)
	e.POST("/operations/:id/resume", app.handleResumeForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // resume a FAILED operation (keyed form, admin)
	e.POST("/operations/:id/cancel", app.handleCancelOperationForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // cancel a live operation (keyed form, admin)
	e.POST("/operations/:id/retry-from", app.handleRetryFromForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // retry a stopped operation from a step, where safe (keyed form, admin)
	e.POST("/reconciliation/:id/resolve", app.handleResolveForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // a decision (keyed form)
	e.POST("/reconciliation/decide", app.handleDecideForm,
		append(adminOnly[:len(adminOnly):len(adminOnly)], app.idempotentForm())...) // a bulk decision (keyed form)
	if app.cfg.DemoMode {
		e.GET("/admin/demo", app.handleDemoPage, adminOnly...)                          // demo controls: the reset, the accounts (admin, demo mode)
		e.POST("/admin/reset", app.handleResetForm, adminOnly...)                       // the reset, confirmed (admin, demo mode)
		e.POST("/admin/crash", app.handleCrashForm, adminOnly...)                       // arm a crash point once, abandon mode (admin, demo mode)
		e.POST("/admin/operations/:id/end-lease", app.handleEndLeaseForm, adminOnly...) // "let its lease run out now" (admin, demo mode)
	}

	// Booking from the grid (hidden idempotency_key per form), and the labs.
	e.POST("/slots/:id/book", app.handleBookSlotForm, keyedForm...)                                           // book, then back to the grid
	e.POST("/bookings/:id/cancel", app.handleCancelBookingForm, keyedForm...)                                 // release, then back to the grid (a deposit booking: to its page)
	e.GET("/bookings/:id", app.handleBookingPage, signedIn...)                                                // one booking; a deposit booking's saga, step by step
	e.GET("/labs", app.handleLabsPage, signedIn...)                                                           // the list of labs
	e.GET("/labs/race", app.handleRaceLabPage, signedIn...)                                                   // the race lab
	e.POST("/labs/race", app.handleRunRace, append(signedIn[:len(signedIn):len(signedIn)], app.limitLabs)...) // run a race (htmx swaps the result panel)
	e.GET("/labs/:name", app.handleLabPage, signedIn...)                                                      // a lab: its lesson, Run, the latest result
	e.POST("/labs/:name/runs", app.handleRunLabForm,
		append(signedIn[:len(signedIn):len(signedIn)], app.limitLabs, app.idempotentForm())...) // run it (keyed form), then its page
	e.GET("/labs/:name/runs/:id", app.handleLabRunPage, signedIn...)                    // one run: the table and both timelines
	e.GET("/labs/:name/runs/:id/operations", app.handleLabOperationsPanel, signedIn...) // the timeout lab's operations (htmx partial)
	return e
}

// routeGroup registers routes under a prefix with middleware in front of
// each. Unlike an echo.Group with middleware, it adds no catch-all route:
// Echo's groups route every unknown path and method under their prefix to a
// 404 so that the group's middleware runs, which would hide 405.
type routeGroup struct {
	e          *echo.Echo
	prefix     string
	middleware []echo.MiddlewareFunc
}

func (g routeGroup) add(method, path string, h echo.HandlerFunc, m []echo.MiddlewareFunc) {
	all := append(g.middleware[:len(g.middleware):len(g.middleware)], m...)
	g.e.Add(method, g.prefix+path, h, all...)
}

func (g routeGroup) GET(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
	g.add(http.MethodGet, path, h, m)
}

func (g routeGroup) POST(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
	g.add(http.MethodPost, path, h, m)
}

func (g routeGroup) PUT(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
	g.add(http.MethodPut, path, h, m)
}
