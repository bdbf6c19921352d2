// Package web is idemlab's HTTP surface. routes.go lists every URL;
// handlers_<feature>.go hold the handlers, one file per feature; errors.go
// is the one table from domain errors to HTTP answers; middleware.go,
// session.go, metrics.go and idempotency.go are the plumbing every request
// passes through.
//
// Handlers parse the request, call one workflow or store method and render
// the result. They open no transaction and write no SQL: the workflows in
// internal/policies and internal/slots own their commits, and the request's
// Idempotency-Key is claimed and completed inside them through
// workflow.Hooks (idempotency.go builds the hooks).
package web

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/gommon/bytes"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/payments"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/reconciliation"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Config is what the HTTP layer needs from the environment (cmd/web reads
// it; docs/api.md lists the variables).
type Config struct {
	InstanceID     string       // INSTANCE_ID: names this replica in pages and timelines
	BodyLimit      string       // BODY_LIMIT: the largest request body, e.g. 1M
	TrustedProxies []*net.IPNet // TRUSTED_PROXIES: whose X-Forwarded-For/-Proto are believed
	RateLimits     RateLimits   // RATE_LIMIT_*: per address and per user (ratelimit.go)
	// DemoMode (DEMO_MODE) enables what only a demo may have: one-click
	// "sign in as", the data reset and the crash switch (routes.go).
	DemoMode       bool
	PasswordCost   int           // PASSWORD_COST: bcrypt's work factor; 0 is users.PasswordCost
	OperationLease time.Duration // OPERATION_LEASE: bounds invariant 6 by default
	// OPERATIONS_RETENTION: invariant 4 cannot speak for policies cancelled
	// before it (their operations may be purged)
	OperationsRetention time.Duration
	ProviderTimeout     time.Duration // PROVIDER_TIMEOUT: shown on the provider page
	PaymentsTimeout     time.Duration // PAYMENTS_TIMEOUT: shown on the payments page
	EventsWindow        time.Duration // EVENTS_DUPLICATE_WINDOW: shown on the Events page
	TasksWindow         time.Duration // TASKS_DEDUPE_WINDOW: shown on the Events page
	// EventsBroker says, on the Events page, which broker carries the events
	// when it is not the one configured (the embedded NATS server); "" says
	// nothing.
	EventsBroker string
}

// Deps are the parts the handlers call. cmd/web builds them once per
// process and shares them with the background loops.
type Deps struct {
	Logger   *slog.Logger
	Accounts []demo.Account // the demo accounts, with the tokens in force
	Secret   []byte         // binds CSRF tokens to sessions; derives generated users' tokens
	Pool     *pgxpool.Pool
	Migrator *database.Migrator
	Registry *prometheus.Registry // this process's metrics, served at /metrics

	Idempotency *idempotency.Store
	Canceller   *policies.Canceller
	// Deposits runs the deposit saga (slots that need a deposit).
	Deposits *slots.Deposits
	// Booker books and releases slots, handing those that need a deposit
	// to Deposits.
	Booker *slots.Booker
	Engine *workflow.Engine // runs every workflow; reads operations for the pages
	// Waiter wakes requests that wait for an outcome (Prefer: wait=N); nil
	// answers at once.
	Waiter   *operations.Waiter
	Recovery *recovery.Loop
	Crash    *crash.Switch

	// Provider is the client the workflows call; ProviderControl sets the
	// fake provider's faults and reads its ledger, wherever it runs.
	Provider        *provider.HTTPClient
	ProviderControl *fake.Control
	// Payments is the payments client the workflows call; PaymentsControl
	// sets the fake payments service's faults and reads its ledger.
	Payments        *payments.HTTPClient
	PaymentsControl *paymentsfake.Control

	// Events reads the outbox, deliveries, mailbox and ledger; Injector is
	// the redelivery injector (internal/events).
	Events   *events.Store
	Injector *events.Injector
	// Broker is what this process's relay knows of its broker (away or
	// answering); nil: no broker of its own here (another transport, or
	// the relay runs in another process).
	Broker *events.BrokerState
	// TasksPush is the Cloud Tasks transport's push handler (events.PushPath);
	// nil serves no push route.
	TasksPush http.Handler

	// Labs runs the numbered labs (internal/labs); nil answers 503.
	Labs *labs.Labs

	// WebhookSecret checks the callbacks of the external systems
	// (WEBHOOK_SECRET); nil: POST /webhooks/{system} answers 404.
	WebhookSecret []byte
}

// App holds every dependency a handler needs. Handlers are its methods
// (handlers_*.go); routes.go says which URL calls which.
type App struct {
	cfg      Config
	logger   *slog.Logger
	accounts []demo.Account
	secret   []byte
	pool     *pgxpool.Pool
	migrator *database.Migrator
	metrics  *metrics
	limits   *limits
	// bodyLimit is BODY_LIMIT in bytes.
	bodyLimit int64

	users    *users.Store
	policies *policies.Store
	slots    *slots.Store
	booker   *slots.Booker // booking and release, one commit each
	lab      *labs.RaceLab // the race lab
	labs     *labs.Labs    // the numbered labs

	provider        *provider.HTTPClient
	providerControl *fake.Control
	payments        *payments.HTTPClient
	paymentsControl *paymentsfake.Control

	idempotency *idempotency.Store
	canceller   *policies.Canceller
	engine      *workflow.Engine
	desk        *reconciliation.Desk
	waiter      *operations.Waiter
	crash       *crash.Switch
	recovery    *recovery.Loop

	// handler is the whole HTTP stack; the double-click lab sends its
	// requests through it.
	handler http.Handler

	events    *events.Store
	injector  *events.Injector
	broker    *events.BrokerState
	tasksPush http.Handler

	// broken caches the invariants check behind the admin pages' banner.
	broken brokenInvariants

	webhookSecret []byte
	callbacks     *prometheus.CounterVec // handlers_webhooks.go
}

// New builds the HTTP layer: stores over d.Pool, metrics on d.Registry,
// and the routes. It panics on a BodyLimit ParseBodyLimit refuses (cmd/web
// checks the environment with it first).
func New(cfg Config, d Deps) *App {
	limit, err := ParseBodyLimit(cfg.BodyLimit)
	if err != nil {
		panic(err)
	}
	app := &App{
		bodyLimit: limit,
		limits:    newLimits(cfg.RateLimits, d.Pool),
		cfg:       cfg,
		logger:    d.Logger,
		accounts:  d.Accounts,
		secret:    d.Secret,
		pool:      d.Pool,
		migrator:  d.Migrator,
		metrics:   newMetrics(d.Registry, d.Pool),

		users:    users.NewStore(d.Pool).WithPasswordCost(cfg.PasswordCost),
		policies: policies.NewStore(d.Pool),
		slots:    slots.NewStore(d.Pool),
		booker:   d.Booker,
		lab:      labs.NewRaceLab(d.Pool),
		labs:     d.Labs,

		provider:        d.Provider,
		providerControl: d.ProviderControl,
		payments:        d.Payments,
		paymentsControl: d.PaymentsControl,

		idempotency: d.Idempotency,
		canceller:   d.Canceller,
		engine:      d.Engine,
		desk:        reconciliation.New(d.Pool, d.Engine),
		waiter:      d.Waiter,
		crash:       d.Crash,
		recovery:    d.Recovery,
	}
	app.events, app.injector, app.tasksPush, app.broker = d.Events, d.Injector, d.TasksPush, d.Broker
	app.webhookSecret, app.callbacks = d.WebhookSecret, newCallbackCounter(d.Registry)
	app.handler = app.routes()
	return app
}

// ParseBodyLimit reads a BODY_LIMIT such as 1M or 512K: a size from 1 KiB
// to 64 MiB.
func ParseBodyLimit(s string) (int64, error) {
	n, err := bytes.Parse(s)
	if err != nil || n < 1<<10 || n > 64<<20 {
		return 0, fmt.Errorf("BODY_LIMIT: %q is not a size from 1K to 64M", s)
	}
	return n, nil
}

// Routes lists every route the app serves; the hostile-input suite
// enumerates them, so a route without cases fails it.
func (app *App) Routes() []*echo.Route { return app.handler.(*echo.Echo).Routes() }

// Handler is the whole HTTP stack.
func (app *App) Handler() http.Handler { return app.handler }
