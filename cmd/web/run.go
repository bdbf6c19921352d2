package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
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
	"github.com/idemlab/idemlab/internal/payments"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/provider/fake"
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
	case "migrate":
		return migrate(ctx, cfg, logger, args, stdout)
	case "healthcheck":
		return healthcheck(ctx, cfg)
	case "user":
		return userCommand(ctx, cfg, getenv, logger, args, stdout)
	default:
		return fmt.Errorf("unknown command %q (want serve, provider, payments, recover, events, kafka, migrate, user or healthcheck)", cmd)
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

// serve opens the database, migrates, seeds, starts the HTTP server and the
// background loops, and on cancellation stops them in reverse order: stop
// accepting and finish in-flight requests, stop loops, close the pool.
func serve(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	pool, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer migrator.Close()

	accounts, err := demoData(ctx, cfg, pool)
	if err != nil {
		return err
	}

	secret := []byte(cfg.SessionSecret)
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret)
		logger.Warn("SESSION_SECRET is unset: sessions end when this process stops and are not shared between replicas")
	}
	if cfg.InstanceID == "" {
		host, _ := os.Hostname()
		cfg.InstanceID = host
	}

	// The fake external systems: in this process unless PROVIDER_URL /
	// PAYMENTS_URL point elsewhere, each on its own listener and pool.
	providerURL, stopProvider, err := inProcess(ctx, cfg, cfg.providerSpec(), logger)
	if err != nil {
		return err
	}
	defer stopProvider()
	paymentsURL, stopPayments, err := inProcess(ctx, cfg, cfg.paymentsSpec(), logger)
	if err != nil {
		return err
	}
	defer stopPayments()
	providerClient := provider.NewHTTPClient(providerURL, cfg.ProviderTimeout)
	defer providerClient.CloseIdleConnections()
	providerControl := fake.NewControlWithToken(providerURL, cfg.FakeControlToken)
	defer providerControl.CloseIdleConnections()
	paymentsClient := payments.NewHTTPClient(paymentsURL, cfg.PaymentsTimeout)
	defer paymentsClient.CloseIdleConnections()
	paymentsControl := paymentsfake.NewControl(paymentsURL, cfg.FakeControlToken)
	defer paymentsControl.CloseIdleConnections()

	// Crash points: the process dies there on purpose (CRASH_AT at start,
	// PUT /api/v1/admin/crash at run time).
	crashes := crash.New(slices.Concat(policies.CrashPoints, events.CrashPoints), logger)
	if err := crashes.Arm(crash.Setting{At: crash.Point(cfg.CrashAt), Mode: crash.Mode(cfg.CrashMode)}); err != nil {
		return fmt.Errorf("CRASH_AT / CRASH_MODE: %w", err)
	}
	registry := prometheus.NewRegistry()
	idem := idempotency.NewStore(pool, cfg.IdempotencyLease, cfg.IdempotencyTTL)
	events.SetCrashSwitch(crashes) // events.Write passes after_outbox_insert
	wf, err := newWorkflows(ctx, cfg, pool, providerClient, paymentsClient, crashes, logger, registry)
	if err != nil {
		return err
	}
	eventsRun := newEventsRuntime(cfg.Events, pool, cfg.InstanceID, crashes, events.NewMetrics(registry), logger)
	// The labs: their own schema, pool, fake systems and Redis keys.
	labRuns, err := labs.New(pool, labs.Config{
		RedisURL: cfg.RedisURL, RedisServer: cfg.RedisServer, Logger: logger.With("component", "labs"),
		Timeouts: &labs.TimeoutsDeps{Canceller: wf.canceller, Provider: providerControl, ProviderTimeout: cfg.ProviderTimeout},
	})
	if err != nil {
		return err
	}
	defer labRuns.Close()

	app := web.New(web.Config{
		InstanceID:      cfg.InstanceID,
		BodyLimit:       cfg.BodyLimit,
		TrustedProxies:  cfg.TrustedProxies,
		RateLimits:      cfg.RateLimits,
		BookingStrategy: cfg.BookingStrategy,
		DemoMode:        cfg.DemoMode,
		OperationLease:  cfg.OperationLease,
		ProviderTimeout: cfg.ProviderTimeout,
		PaymentsTimeout: cfg.PaymentsTimeout,
		EventsWindow:    cfg.Events.DuplicateWindow,
	}, web.Deps{
		Logger:          logger,
		Accounts:        accounts,
		Secret:          secret,
		Pool:            pool,
		Migrator:        migrator,
		Registry:        registry,
		Idempotency:     idem,
		Canceller:       wf.canceller,
		Engine:          wf.engine,
		Recovery:        wf.recovery,
		Crash:           crashes,
		Provider:        providerClient,
		ProviderControl: providerControl,
		Payments:        paymentsClient,
		PaymentsControl: paymentsControl,
		Events:          events.NewStore(pool),
		Injector:        eventsRun.injector,
		Labs:            labRuns,
	})

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{
		Handler:           app.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	banner(stdout, ln.Addr(), providerURL, paymentsURL, accounts)

	// Background loops share loopCtx; cancelling it and waiting on loops is
	// the second step of shutdown.
	loopCtx, stopLoops := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	defer func() { stopLoops(); loops.Wait() }()
	startLoop := func(run func(context.Context)) {
		loops.Add(1)
		go func() { defer loops.Done(); run(loopCtx) }()
	}
	// Completed keys are replayed for IDEMPOTENCY_TTL, then purged.
	startLoop(idempotency.NewJanitor(idem, idempotency.JanitorConfig{Logger: logger}).Run)
	// Operations a timeout or a crash left IN_PROGRESS are finished here,
	// by whichever instance claims them first.
	startLoop(wf.recovery.Run)
	// Events: the relay (NATS) and one instance of each consumer, on
	// EVENTS_TRANSPORT — unless they run in `web events` (EVENTS_WORKERS=off).
	if cfg.Events.Workers {
		startLoop(eventsRun.Run)
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("serving", "addr", ln.Addr().String())

	select {
	case err := <-serveErr:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	logger.Info("shutting down: finishing in-flight requests", "grace", cfg.ShutdownGrace)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Error("shutdown", "err", err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
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
func openMigrated(ctx context.Context, cfg config, logger *slog.Logger) (*pgxpool.Pool, *database.Migrator, error) {
	type opened struct {
		pool     *pgxpool.Pool
		migrator *database.Migrator
	}
	o, err := database.WaitFor(ctx, logger, "open and migrate", func(ctx context.Context) (opened, error) {
		pool, err := database.Open(ctx, cfg.DatabaseURL, cfg.DBMaxConns)
		if err != nil {
			return opened{}, err
		}
		migrator, err := database.NewMigrator(pool, logger)
		if err != nil {
			pool.Close()
			return opened{}, err
		}
		if err := migrator.Up(ctx); err != nil {
			migrator.Close()
			pool.Close()
			return opened{}, err
		}
		return opened{pool, migrator}, nil
	})
	return o.pool, o.migrator, err
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
	pool, err := database.Open(ctx, cfg.DatabaseURL, 2)
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
