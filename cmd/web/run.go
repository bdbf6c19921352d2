package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/tracing"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/internal/web"
)

// run is the whole program. It returns when ctx is cancelled (SIGINT or
// SIGTERM in main, the end of a test) after shutting down in order.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	// One trace per request, carried to every process it reaches
	// (internal/tracing); exported only where OTEL_EXPORTER_OTLP_* says.
	flush, err := tracing.Setup(ctx, "idemlab-"+cmd)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer flush(context.Background())

	switch cmd {
	case "serve":
		return serve(ctx, cfg, logger, stdout)
	case "provider":
		return serveFake(ctx, cfg, cfg.providerSpec(), logger, stdout)
	case "payments":
		return serveFake(ctx, cfg, cfg.paymentsSpec(), logger, stdout)
	case "recover":
		return recoverOnly(ctx, cfg, logger, stdout)
	case "events":
		return eventsOnly(ctx, cfg, logger, stdout)
	case "kafka":
		return kafkaOnly(ctx, cfg, logger, stdout)
	case "tasks":
		return tasksOnly(ctx, cfg, logger, stdout)
	case "migrate":
		return migrate(ctx, cfg, logger, args, stdout)
	case "healthcheck":
		return healthcheck(ctx, cfg)
	case "user":
		return userCommand(ctx, cfg, getenv, logger, args, stdout)
	default:
		return fmt.Errorf("unknown command %q (want serve, provider, payments, recover, events, kafka, tasks, migrate, user or healthcheck)", cmd)
	}
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	l := slog.New(h)
	if cfg.InstanceID != "" {
		l = l.With("instance", cfg.InstanceID)
	}
	return l
}

// serve is `web serve`: the app, its background loops and (unless pointed
// elsewhere) the fake external systems, in one process. Each step below is a
// function of its own; shutdown runs them backwards: stop accepting and finish
// in-flight requests, stop the loops, close the clients, the fakes and the pool.
func serve(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()

	accounts, err := seedDemo(ctx, cfg, pool, logger)
	if err != nil {
		return err
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID, _ = os.Hostname()
	}
	ext, err := startExternals(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer ext.close()
	crashes, err := armCrashes(cfg, logger)
	if err != nil {
		return err
	}

	registry := prometheus.NewRegistry()
	idem := idempotency.NewStore(pool, cfg.IdempotencyLease, cfg.IdempotencyTTL)
	wf, err := newWorkflows(ctx, cfg, pool, ext.provider, ext.payments, crashes, logger, registry)
	if err != nil {
		return err
	}
	// Events: without NATS_URL and with nothing answering at its default,
	// an embedded NATS server (the workers' broker, so only where they run).
	var brokerNote string
	if cfg.Events.Workers {
		var stopNATS func()
		if brokerNote, stopNATS, err = embedNATS(&cfg.Events, logger); err != nil {
			return err
		}
		defer stopNATS()
	}
	eventsRun := newEventsRuntime(cfg.Events, pool, direct, cfg.InstanceID, crashes, events.NewMetrics(registry), logger)
	tasksPush, err := eventsRun.pushHandler()
	if err != nil {
		return err
	}
	// The labs: their own schema, pool, fake systems and Redis keys.
	labRuns, err := labs.New(pool, labs.Config{
		RedisURL: cfg.RedisURL, RedisServer: cfg.RedisServer, PostgresBinDir: cfg.PostgresBinDir, Logger: logger.With("component", "labs"),
		Timeouts: &labs.TimeoutsDeps{Canceller: wf.canceller, Provider: ext.providerControl, ProviderTimeout: cfg.ProviderTimeout},
	})
	if err != nil {
		return err
	}
	defer labRuns.Close()

	secret, err := sessionSecret(ctx, cfg, pool, logger)
	if err != nil {
		return err
	}
	// Requests that wait for an outcome (Prefer: wait=N) are woken by one
	// LISTEN connection per process, to the database itself.
	waiter := operations.NewWaiter(pool, direct.Config().ConnConfig, logger)
	hookSecret, err := webhookSecret(ctx, cfg, pool)
	if err != nil {
		return err
	}
	webCfg := webConfig(cfg)
	webCfg.EventsBroker = brokerNote
	app := web.New(webCfg, web.Deps{
		Logger:          logger,
		Accounts:        accounts,
		Secret:          secret,
		Pool:            pool,
		Migrator:        migrator,
		Registry:        registry,
		Idempotency:     idem,
		Canceller:       wf.canceller,
		Deposits:        wf.deposits,
		Booker:          wf.booker,
		Engine:          wf.engine,
		Waiter:          waiter,
		Recovery:        wf.recovery,
		Crash:           crashes,
		Provider:        ext.provider,
		ProviderControl: ext.providerControl,
		Payments:        ext.payments,
		PaymentsControl: ext.paymentsControl,
		Events:          events.NewStore(pool),
		Injector:        eventsRun.injector,
		Broker:          eventsRun.broker,
		TasksPush:       tasksPush,
		Labs:            labRuns,
		WebhookSecret:   hookSecret,
	})

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	banner(stdout, ln.Addr(), ext.providerURL, ext.paymentsURL, accounts)
	// The task queue pushes to this instance unless TASKS_PUSH_URL names a
	// load balancer over all of them.
	eventsRun.cfg.Tasks.PushURL = cmp.Or(eventsRun.cfg.Tasks.PushURL, "http://"+dialable(ln.Addr()))

	var bg background
	defer bg.stop()
	// Completed keys are replayed for IDEMPOTENCY_TTL, then purged.
	bg.start(idempotency.NewJanitor(idem, idempotency.JanitorConfig{Logger: logger}).Run)
	// Operations a timeout or a crash left IN_PROGRESS are finished here,
	// by whichever instance claims them first.
	bg.start(wf.recovery.Run)
	bg.start(waiter.Run)
	// Finished operations, with their steps, calls, timeline and decisions,
	// are kept for OPERATIONS_RETENTION, then purged.
	bg.start(operations.NewJanitor(pool, operations.JanitorConfig{Retention: cfg.OperationsRetention, Logger: logger}).Run)
	// Events: the relay and one instance of each consumer, on
	// EVENTS_TRANSPORT — unless they run in `web events` (EVENTS_WORKERS=off).
	if cfg.Events.Workers {
		bg.start(eventsRun.Run)
	}
	// Callbacks: the fakes in this process call this instance back (when
	// their webhook mode is not off) unless WEBHOOK_URL names another.
	for _, fs := range ext.fakes {
		bg.start(fs.callbacks(cmp.Or(cfg.WebhookURL, "http://"+dialable(ln.Addr())), hookSecret, logger).Run)
	}
	return serveHTTP(ctx, ln, app.Handler(), cfg.ShutdownGrace, logger)
}

// webConfig is the part of the configuration the HTTP layer reads.
func webConfig(cfg config) web.Config {
	return web.Config{
		InstanceID:          cfg.InstanceID,
		BodyLimit:           cfg.BodyLimit,
		TrustedProxies:      cfg.TrustedProxies,
		RateLimits:          cfg.RateLimits,
		DemoMode:            cfg.DemoMode,
		PasswordCost:        cfg.PasswordCost,
		OperationLease:      cfg.OperationLease,
		OperationsRetention: cfg.OperationsRetention,
		ProviderTimeout:     cfg.ProviderTimeout,
		PaymentsTimeout:     cfg.PaymentsTimeout,
		EventsWindow:        cfg.Events.DuplicateWindow,
		TasksWindow:         cfg.Events.Tasks.DedupeWindow,
	}
}

// sessionSecret binds CSRF tokens to sessions and derives generated users'
// tokens. Without SESSION_SECRET it is the one kept in the database, made
// once: a restart (the crash demo) keeps every open form valid, and
// replicas share it without being told.
func sessionSecret(ctx context.Context, cfg config, pool *pgxpool.Pool, logger *slog.Logger) ([]byte, error) {
	if cfg.SessionSecret != "" {
		return []byte(cfg.SessionSecret), nil
	}
	logger.Info("SESSION_SECRET is unset: using the secret kept in the database (server_secrets), shared by replicas and restarts")
	return users.NewStore(pool).ServerSecret(ctx, "session")
}

// webhookSecret signs and checks the fakes' callbacks: WEBHOOK_SECRET, or
// the one kept in the database, shared by replicas and restarts.
func webhookSecret(ctx context.Context, cfg config, pool *pgxpool.Pool) ([]byte, error) {
	if cfg.WebhookSecret != "" {
		return []byte(cfg.WebhookSecret), nil
	}
	return users.NewStore(pool).ServerSecret(ctx, "webhook")
}

// externals are the clients of the two external systems and the fakes'
// control APIs. The fakes run in this process, each on its own listener and
// pool, unless PROVIDER_URL / PAYMENTS_URL point elsewhere; either way the
// app reaches them over HTTP only.
type externals struct {
	providerURL, paymentsURL string
	provider                 *provider.HTTPClient
	providerControl          *fake.Control
	payments                 *payments.HTTPClient
	paymentsControl          *paymentsfake.Control
	fakes                    []*fakeServer // those running in this process
	stops                    []func()
}

func startExternals(ctx context.Context, cfg config, logger *slog.Logger) (*externals, error) {
	ext := &externals{}
	var err error
	var stop func()
	var fs *fakeServer
	if ext.providerURL, stop, fs, err = inProcess(ctx, cfg, cfg.providerSpec(), logger); err != nil {
		return nil, err
	}
	ext.stops = append(ext.stops, stop)
	if fs != nil {
		ext.fakes = append(ext.fakes, fs)
	}
	if ext.paymentsURL, stop, fs, err = inProcess(ctx, cfg, cfg.paymentsSpec(), logger); err != nil {
		ext.close()
		return nil, err
	}
	ext.stops = append(ext.stops, stop)
	if fs != nil {
		ext.fakes = append(ext.fakes, fs)
	}
	ext.provider = provider.NewHTTPClient(ext.providerURL, cfg.ProviderTimeout)
	ext.providerControl = fake.NewControlWithToken(ext.providerURL, cfg.FakeControlToken)
	ext.payments = payments.NewHTTPClient(ext.paymentsURL, cfg.PaymentsTimeout)
	ext.paymentsControl = paymentsfake.NewControl(ext.paymentsURL, cfg.FakeControlToken)
	ext.stops = append(ext.stops,
		ext.provider.CloseIdleConnections, ext.providerControl.CloseIdleConnections,
		ext.payments.CloseIdleConnections, ext.paymentsControl.CloseIdleConnections)
	return ext, nil
}

// close releases what startExternals opened, last opened first.
func (ext *externals) close() {
	for i := len(ext.stops) - 1; i >= 0; i-- {
		ext.stops[i]()
	}
}

// armCrashes makes the crash switch: the process dies at a named point on
// purpose (CRASH_AT at start, PUT /api/v1/admin/crash at run time).
func armCrashes(cfg config, logger *slog.Logger) (*crash.Switch, error) {
	crashes := crash.New(slots.UniquePoints(policies.CrashPoints, slots.DepositCrashPoints, events.CrashPoints), logger)
	if err := crashes.Arm(crash.Setting{At: crash.Point(cfg.CrashAt), Mode: crash.Mode(cfg.CrashMode)}); err != nil {
		return nil, fmt.Errorf("CRASH_AT / CRASH_MODE: %w", err)
	}
	return crashes, nil
}

// background runs the loops that live as long as the server. They get a
// context of their own, cancelled only after the HTTP server has finished
// its in-flight requests (which may still hand work to them).
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (bg *background) start(loop func(context.Context)) {
	if bg.ctx == nil {
		bg.ctx, bg.cancel = context.WithCancel(context.Background())
	}
	bg.wg.Add(1)
	go func() { defer bg.wg.Done(); loop(bg.ctx) }()
}

func (bg *background) stop() {
	if bg.cancel != nil {
		bg.cancel()
	}
	bg.wg.Wait()
}

// serveHTTP serves until ctx ends, then stops accepting and gives in-flight
// requests up to grace to finish.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration, logger *slog.Logger) error {
	srv := &http.Server{
		Handler:           tracing.Handler(h, "idemlab"),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("serving", "addr", ln.Addr().String())

	select {
	case err := <-serveErr:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down: finishing in-flight requests", "grace", grace)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Error("shutdown", "err", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// seedDemo is demoData waiting for a database that went away after the
// migration: a restart between two steps of a start ended the process
// ("web: conn closed", found by a chaos run). demoData is one transaction,
// so an attempt that failed left nothing behind.
func seedDemo(ctx context.Context, cfg config, pool *pgxpool.Pool, logger *slog.Logger) ([]demo.Account, error) {
	return database.WaitFor(ctx, logger, "seed the demo data", func(ctx context.Context) ([]demo.Account, error) {
		return demoData(ctx, cfg, pool)
	})
}

// demoData seeds the demo accounts, their policies and a week of slots in
// demo mode, and returns the accounts. Outside demo mode it seeds nothing
// and refuses to start while any account still has a demo token: those
// tokens are printed in the README, so they must not open a real instance.
func demoData(ctx context.Context, cfg config, pool *pgxpool.Pool) ([]demo.Account, error) {
	accounts, err := demo.ParseTokens(cfg.DemoTokens)
	if err != nil {
		return nil, err
	}
	if !cfg.DemoMode {
		names, err := demo.AccountsWithDefaultTokens(ctx, pool)
		if err != nil {
			return nil, err
		}
		if len(names) > 0 {
			return nil, fmt.Errorf("DEMO_MODE is off but %s still open with the public demo tokens: "+
				"give each a new one (web user set NAME -token) or start with DEMO_MODE=true", strings.Join(names, ", "))
		}
		return nil, nil
	}
	if err := demo.Seed(ctx, pool, accounts, time.Now()); err != nil {
		return nil, err
	}
	return accounts, nil
}

// openMigrated opens the pool and applies pending migrations — what every
// long-running command (serve, provider, payments, recover) does first.
// Replicas starting together take turns: goose holds a Postgres session
// lock. A database that is down, restarting or still in crash recovery is
// waited for (logged, with backoff) instead of ending the process.
//
// direct is a pool on DATABASE_DIRECT_URL (two connections: the migrator's
// session lock and the relay's LISTEN) when DATABASE_URL goes through a
// pooler in transaction mode; otherwise it is pool itself (closing a
// pgxpool twice is harmless).
func openMigrated(ctx context.Context, cfg config, logger *slog.Logger) (pool, direct *pgxpool.Pool, m *database.Migrator, err error) {
	type opened struct {
		pool, direct *pgxpool.Pool
		migrator     *database.Migrator
	}
	o, err := database.WaitFor(ctx, logger, "open and migrate", func(ctx context.Context) (opened, error) {
		pool, err := database.Open(ctx, cfg.DatabaseURL, cfg.DBMaxConns)
		if err != nil {
			return opened{}, err
		}
		direct := pool
		if cfg.DatabaseDirectURL != "" {
			if direct, err = database.Open(ctx, cfg.DatabaseDirectURL, 2); err != nil {
				pool.Close()
				return opened{}, err
			}
		}
		migrator, err := database.NewMigrator(direct, logger)
		if err != nil {
			pool.Close()
			direct.Close()
			return opened{}, err
		}
		if err := migrator.Up(ctx); err != nil {
			migrator.Close()
			pool.Close()
			direct.Close()
			return opened{}, err
		}
		return opened{pool, direct, migrator}, nil
	})
	return o.pool, o.direct, o.migrator, err
}

// banner prints where the app listens and the demo tokens, for people and
// for tests that start the server on port 0 and read the address back.
func banner(w io.Writer, addr net.Addr, providerURL, paymentsURL string, accounts []demo.Account) {
	var b strings.Builder
	fmt.Fprintf(&b, "provider at %s\n", providerURL)
	fmt.Fprintf(&b, "payments at %s\n", paymentsURL)
	fmt.Fprintf(&b, "idemlab listening on http://%s\n", dialable(addr))
	if len(accounts) > 0 {
		b.WriteString("demo mode; demo API tokens (Authorization: Bearer <token>):\n")
		for _, a := range accounts {
			fmt.Fprintf(&b, "  %-6s %s\n", a.Name, a.Token)
		}
	}
	io.WriteString(w, b.String())
}

func migrate(ctx context.Context, cfg config, logger *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: web migrate up|down|status")
	}
	// The migrations' session lock needs the database itself, not a
	// pooler in transaction mode.
	pool, err := database.Open(ctx, cmp.Or(cfg.DatabaseDirectURL, cfg.DatabaseURL), 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := database.NewMigrator(pool, logger)
	if err != nil {
		return err
	}
	defer m.Close()
	switch args[0] {
	case "up":
		return m.Up(ctx)
	case "down":
		return m.Down(ctx)
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			applied := "pending"
			if !s.AppliedAt.IsZero() {
				applied = s.AppliedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%5d  %-40s %s\n", s.Source.Version, s.Source.Path, applied)
		}
		return nil
	default:
		return fmt.Errorf("unknown migrate command %q (want up, down or status)", args[0])
	}
}

// healthcheck is for container healthchecks in an image with no shell or curl.
func healthcheck(ctx context.Context, cfg config) error {
	_, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR %q: %w", cfg.Addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+port+"/healthz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz answered %d", resp.StatusCode)
	}
	return nil
}
