package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/payments"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
)

// workflows is the step engine with every workflow registered, the
// booker (whose workflows commit once and need no engine), and the
// recovery loop that finishes what they leave behind.
type workflows struct {
	engine    *workflow.Engine
	canceller *policies.Canceller
	deposits  *slots.Deposits
	booker    *slots.Booker
	recovery  *recovery.Loop
}

// newWorkflows builds the engine, registers the cancellation, seeds what
// the app believes about each system (PROVIDER_IDEMPOTENT_CALLS, …) and
// builds the recovery loop: one claimer for every kind of operation,
// dispatching by kind.
func newWorkflows(ctx context.Context, cfg config, pool *pgxpool.Pool, p provider.Client, pay payments.Client,
	crashes *crash.Switch, logger *slog.Logger, reg prometheus.Registerer) (*workflows, error) {
	if err := seedBeliefs(ctx, cfg, pool, logger); err != nil {
		return nil, err
	}
	engine := workflow.NewEngine(pool, workflow.Config{
		Lease: cfg.Recovery.Lease, Crash: crashes, Registerer: reg, Logger: logger.With("component", "workflow"),
	})
	// Every workflow writes its events through one writer: the crash
	// switch's after_outbox_insert is in it.
	outbox := events.NewWriter(crashes)
	w := &workflows{engine: engine, canceller: policies.NewCanceller(engine, p, pay, outbox),
		deposits: slots.NewDeposits(engine, pay, outbox, cfg.DepositHold)}
	w.booker = slots.NewBooker(pool, outbox).WithDeposits(w.deposits)
	rc := cfg.Recovery
	rc.Instance, rc.Logger, rc.Registerer = cfg.InstanceID, logger.With("component", "recovery"), reg
	w.recovery = recovery.New(engine, rc)
	for _, typ := range engine.Types() {
		w.recovery.Register(typ, abandonable{engine})
	}
	return w, nil
}

// abandonable ends a recovery attempt that meets a crash point armed to
// abandon (the demo controls) as a killed worker's attempt ends — nothing
// more written, its lease left to run out for the next claim — instead of
// ending the process: the abandon is net/http's http.ErrAbortHandler,
// which net/http recovers only on a request's goroutine, and recovery runs
// on its own (fourth read: the app exited). Only the exhibit arms it; the
// pattern's code is untouched.
type abandonable struct{ recovery.Recoverer }

func (a abandonable) Recover(ctx context.Context, c recovery.Claim, b recovery.Budget) (res recovery.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			err = fmt.Errorf("recovery of operation %d abandoned at an armed crash point: its lease runs out, then it is claimed again", c.ID)
		}
	}()
	return a.Recoverer.Recover(ctx, c, b)
}

// seedBeliefs tells the app what the environment says about each system
// (recovery.SeedBelief: a person's word since the last start outlives it),
// waiting for a database that went away after the migration.
func seedBeliefs(ctx context.Context, cfg config, pool *pgxpool.Pool, logger *slog.Logger) error {
	for _, system := range slices.Sorted(maps.Keys(cfg.Beliefs)) {
		type seeded struct {
			recovery.Belief
			applied bool
		}
		s, err := database.WaitFor(ctx, logger, "seed the belief about "+system, func(ctx context.Context) (seeded, error) {
			b, applied, err := recovery.SeedBelief(ctx, pool, system, cfg.Beliefs[system], cfg.beliefSources[system], cfg.InstanceID)
			return seeded{b, applied}, err
		})
		if err != nil {
			return err
		}
		if !s.applied {
			logger.Warn("belief about an external system: a person's word outlives this start", "system", system,
				"idempotent", s.Idempotent, "set_by", s.UpdatedBy, "set_at", s.UpdatedAt,
				"ignored", cfg.beliefSources[system]+"="+fmt.Sprint(cfg.Beliefs[system]))
			continue
		}
		logger.Info("belief about an external system", "system", system, "idempotent", s.Idempotent, "set_by", s.UpdatedBy)
	}
	return nil
}

// recoverOnly is `web recover`: the recovery loop alone, for a worker
// process next to (or instead of) the loops inside `web serve`. It needs
// PROVIDER_URL and PAYMENTS_URL: there are no in-process fakes to reach.
func recoverOnly(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	if cfg.ProviderURL == "" || cfg.PaymentsURL == "" {
		return errors.New("web recover needs PROVIDER_URL and PAYMENTS_URL: the systems the app instances call")
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = "recover"
	}
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()
	client := provider.NewHTTPClient(cfg.ProviderURL, cfg.ProviderTimeout)
	defer client.CloseIdleConnections()
	pay := payments.NewHTTPClient(cfg.PaymentsURL, cfg.PaymentsTimeout)
	defer pay.CloseIdleConnections()
	w, err := newWorkflows(ctx, cfg, pool, client, pay, nil, logger, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "recovery loop %q running (%s every %s)\n", cfg.InstanceID, cfg.Recovery.Strategy, cfg.Recovery.Interval)
	w.recovery.Run(ctx)
	return nil
}
