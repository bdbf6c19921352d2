package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/fault"
	paymentsfake "github.com/idemlab/idemlab/internal/payments/fake"
	providerfake "github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/tracing"
)

// The fake external systems — the provider and payments — run the same way:
// in this process on a listener of their own unless <NAME>_URL points
// elsewhere, or alone as `web provider` / `web payments`. The app reaches
// them over real HTTP either way, so every timeout is a real one.

// fakeSystem is what the wiring needs of a fake; both fakes are a
// fault.Service with their own routes.
type fakeSystem interface {
	Handler() http.Handler
	Close()
	Faults(ctx context.Context) (fault.Config, error)
	SetFaults(ctx context.Context, f fault.Fault) (fault.Config, error)
	Webhooks() fault.Outbox
}

// fakeSpec is one fake system's settings from the environment.
type fakeSpec struct {
	name       string // "provider", "payments": logs, errors, the env prefix
	env        string // "PROVIDER", "PAYMENTS"
	url        string // <ENV>_URL: run nothing here, call that
	addr       string // <ENV>_ADDR: where the fake listens when it runs here
	faultMode  string // <ENV>_FAULT_MODE, applied at start
	idempotent string // <ENV>_IDEMPOTENT, applied at start
	build      func(*pgxpool.Pool, fault.Options) fakeSystem
}

func (c config) providerSpec() fakeSpec {
	return fakeSpec{name: "provider", env: "PROVIDER", url: c.ProviderURL, addr: c.ProviderAddr,
		faultMode: c.ProviderFaultMode, idempotent: c.ProviderIdempotent,
		build: func(p *pgxpool.Pool, o fault.Options) fakeSystem { return providerfake.New(p, o) }}
}

func (c config) paymentsSpec() fakeSpec {
	return fakeSpec{name: "payments", env: "PAYMENTS", url: c.PaymentsURL, addr: c.PaymentsAddr,
		faultMode: c.PaymentsFaultMode, idempotent: c.PaymentsIdempotent,
		build: func(p *pgxpool.Pool, o fault.Options) fakeSystem { return paymentsfake.New(p, o) }}
}

// fakeControlAccess is who may use the fakes' control APIs: loopback
// callers, or anyone with FAKE_CONTROL_TOKEN when it is set (compose, where
// the app reaches the fakes over the network). Demo mode does not open it.
func (c config) fakeControlAccess() fault.Access { return fault.Access{Token: c.FakeControlToken} }

// fakeServer is one fake on its own listener.
type fakeServer struct {
	name string
	fake fakeSystem
	db   *pgxpool.Pool // the pool it runs on
	pool *pgxpool.Pool // its own, when it runs inside the app; nil when the caller owns it
	srv  *http.Server
	url  string
	done chan error
}

// startFake serves spec's fake on spec.addr over pool (a new pool of its own
// when pool is nil: an external system shares nothing with the app but the
// database server) and applies the start-up faults from the environment.
func startFake(ctx context.Context, cfg config, spec fakeSpec, pool *pgxpool.Pool, logger *slog.Logger) (*fakeServer, error) {
	fs := &fakeServer{name: spec.name, done: make(chan error, 1)}
	if pool == nil {
		var err error
		pool, err = database.WaitFor(ctx, logger, spec.name, func(ctx context.Context) (*pgxpool.Pool, error) {
			return database.Open(ctx, cfg.DatabaseURL, cfg.FakeDBMaxConns)
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.name, err)
		}
		fs.pool = pool
	}
	fs.db = pool
	fs.fake = spec.build(pool, fault.Options{Logger: logger.With("component", "fake-"+spec.name), Control: cfg.fakeControlAccess()})
	if err := applyStartupFaults(ctx, spec, fs.fake); err != nil {
		fs.closePool()
		return nil, err
	}
	ln, err := net.Listen("tcp", spec.addr)
	if err != nil {
		fs.closePool()
		return nil, fmt.Errorf("%s: listen %s: %w", spec.name, spec.addr, err)
	}
	fs.srv = &http.Server{Handler: tracing.Handler(fs.fake.Handler(), spec.name), ReadHeaderTimeout: 5 * time.Second}
	fs.url = "http://" + dialable(ln.Addr())
	go func() { fs.done <- fs.srv.Serve(ln) }()
	return fs, nil
}

// stop releases held requests first (a held request would otherwise keep
// graceful shutdown waiting), then shuts the listener down, then closes the
// fake's own pool.
func (fs *fakeServer) stop(ctx context.Context) error {
	fs.fake.Close()
	err := fs.srv.Shutdown(ctx)
	if serveErr := <-fs.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = serveErr
	}
	fs.closePool()
	return err
}

// callbacks returns the fake's webhook sender, pushing to baseURL's
// POST /webhooks/{system}.
func (fs *fakeServer) callbacks(baseURL string, secret []byte, logger *slog.Logger) *fault.Sender {
	return fault.NewSender(fs.db, fs.fake.Webhooks(), fault.SenderConfig{
		URL: strings.TrimRight(baseURL, "/") + "/webhooks/" + fs.name, Secret: secret,
		Logger: logger.With("component", "fake-"+fs.name+"-callbacks"),
	})
}

func (fs *fakeServer) closePool() {
	if fs.pool != nil {
		fs.pool.Close()
	}
}

// applyStartupFaults sets <ENV>_FAULT_MODE and <ENV>_IDEMPOTENT on the
// global fault, keeping its other settings.
func applyStartupFaults(ctx context.Context, spec fakeSpec, f fakeSystem) error {
	if spec.faultMode == "" && spec.idempotent == "" {
		return nil
	}
	current, err := f.Faults(ctx)
	if err != nil {
		return err
	}
	g := current.Global
	if spec.faultMode != "" {
		g.Mode = fault.Mode(spec.faultMode)
	}
	if spec.idempotent != "" {
		g.Idempotent = spec.idempotent == "true"
	}
	if _, err := f.SetFaults(ctx, g); err != nil {
		return fmt.Errorf("%s_FAULT_MODE/%s_IDEMPOTENT: %w", spec.env, spec.env, err)
	}
	return nil
}

// inProcess starts spec's fake here unless spec.url points elsewhere, and
// returns the URL the app calls, a stop function for shutdown, and the fake
// (nil when it runs elsewhere).
func inProcess(ctx context.Context, cfg config, spec fakeSpec, logger *slog.Logger) (string, func(), *fakeServer, error) {
	if spec.url != "" {
		return spec.url, func() {}, nil, nil
	}
	fs, err := startFake(ctx, cfg, spec, nil, logger)
	if err != nil {
		return "", nil, nil, err
	}
	return fs.url, func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
		defer cancel()
		if err := fs.stop(stopCtx); err != nil {
			logger.Error(spec.name+" shutdown", "err", err)
		}
	}, fs, nil
}

// serveFake is `web provider` and `web payments`: one fake alone, for
// docker-compose and for several app replicas sharing one system.
func serveFake(ctx context.Context, cfg config, spec fakeSpec, logger *slog.Logger, stdout io.Writer) error {
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()
	fs, err := startFake(ctx, cfg, spec, pool, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fake %s listening on %s\n", spec.name, fs.url)
	if cfg.WebhookURL != "" {
		secret, err := webhookSecret(ctx, cfg, pool)
		if err != nil {
			return err
		}
		sendCtx, stopSending := context.WithCancel(ctx)
		defer stopSending()
		go fs.callbacks(cfg.WebhookURL, secret, logger).Run(sendCtx)
	}
	select {
	case err := <-fs.done:
		return fmt.Errorf("%s: %w", spec.name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	return fs.stop(shutdownCtx)
}

// dialable turns a listener address into host:port a client can dial
// (":8081" listens everywhere; clients dial 127.0.0.1:8081).
func dialable(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return addr.String()
}
