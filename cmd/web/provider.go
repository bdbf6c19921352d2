package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/provider/fake"
)

// providerServer is the fake provider on its own listener. The app reaches
// it over real HTTP even in-process, so every timeout is a real one.
type providerServer struct {
	fake *fake.Provider
	srv  *http.Server
	url  string
	done chan error
}

// startProvider serves the fake provider on addr and applies the start-up
// faults from the environment (PROVIDER_FAULT_MODE, PROVIDER_IDEMPOTENT).
func startProvider(ctx context.Context, cfg config, pool *pgxpool.Pool, logger *slog.Logger) (*providerServer, error) {
	p := fake.New(pool, fake.Options{Logger: logger.With("component", "fake-provider")})
	if err := applyStartupFaults(ctx, cfg, p); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.ProviderAddr)
	if err != nil {
		return nil, fmt.Errorf("provider: listen %s: %w", cfg.ProviderAddr, err)
	}
	ps := &providerServer{
		fake: p,
		srv:  &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 5 * time.Second},
		url:  "http://" + dialable(ln.Addr()),
		done: make(chan error, 1),
	}
	go func() { ps.done <- ps.srv.Serve(ln) }()
	return ps, nil
}

// stop releases held requests first (a held request would otherwise keep
// graceful shutdown waiting), then shuts the listener down.
func (ps *providerServer) stop(ctx context.Context) error {
	ps.fake.Close()
	err := ps.srv.Shutdown(ctx)
	if serveErr := <-ps.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return err
}

func applyStartupFaults(ctx context.Context, cfg config, p *fake.Provider) error {
	if cfg.ProviderFaultMode == "" && cfg.ProviderIdempotent == "" {
		return nil
	}
	current, err := p.Faults(ctx)
	if err != nil {
		return err
	}
	f := current.Global
	if cfg.ProviderFaultMode != "" {
		f.Mode = fake.Mode(cfg.ProviderFaultMode)
	}
	if cfg.ProviderIdempotent != "" {
		f.Idempotent = cfg.ProviderIdempotent == "true"
	}
	if _, err := p.SetFaults(ctx, f); err != nil {
		return fmt.Errorf("PROVIDER_FAULT_MODE/PROVIDER_IDEMPOTENT: %w", err)
	}
	return nil
}

// serveProvider is `web provider`: the fake provider alone, for
// docker-compose and for several app replicas sharing one provider.
func serveProvider(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	pool, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer migrator.Close()
	ps, err := startProvider(ctx, cfg, pool, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "fake provider listening on %s\n", ps.url)
	select {
	case err := <-ps.done:
		return fmt.Errorf("provider: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	return ps.stop(shutdownCtx)
}

// dialable turns a listener address into host:port a client can dial
// (":8081" listens everywhere; clients dial 127.0.0.1:8081).
func dialable(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return addr.String()
}
