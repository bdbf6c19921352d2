package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/provider"
	"github.com/idemlab/idemlab/internal/recovery"
)

// recoveryConfig is the RECOVERY_* environment (docs/api.md lists it).
type recoveryConfig struct {
	Interval     time.Duration // RECOVERY_INTERVAL: pause between passes
	Claim        recovery.Strategy
	Batch        int           // RECOVERY_BATCH: operations claimed per pass
	MaxPolls     int           // RECOVERY_MAX_POLLS: status queries while RUNNING/unreachable (0: none)
	PollInterval time.Duration // RECOVERY_POLL_INTERVAL: first wait between polls, doubling
	MaxAttempts  int           // RECOVERY_MAX_ATTEMPTS: attempts before reconciliation
	Backoff      time.Duration // RECOVERY_BACKOFF: first wait after an attempt that learned nothing, doubling
	// IdempotentCalls says whether a provider call whose outcome is still
	// unknown may be sent again (PROVIDER_IDEMPOTENT_CALLS; defaults to
	// PROVIDER_IDEMPOTENT, else true). Against a provider that is not
	// idempotent it must be false: a blind retry could cancel twice.
	IdempotentCalls bool
}

func loadRecoveryConfig(getenv func(string) string) (recoveryConfig, error) {
	rc := recoveryConfig{IdempotentCalls: true}
	var err error
	if rc.Interval, err = durationEnv(getenv, "RECOVERY_INTERVAL", time.Second); err != nil {
		return rc, err
	}
	if rc.PollInterval, err = durationEnv(getenv, "RECOVERY_POLL_INTERVAL", 500*time.Millisecond); err != nil {
		return rc, err
	}
	if rc.Backoff, err = durationEnv(getenv, "RECOVERY_BACKOFF", time.Second); err != nil {
		return rc, err
	}
	if rc.Claim, err = recovery.ParseStrategy(or(getenv("RECOVERY_CLAIM"), string(recovery.SkipLocked))); err != nil {
		return rc, fmt.Errorf("RECOVERY_CLAIM: %q is neither skip-locked nor transition", getenv("RECOVERY_CLAIM"))
	}
	n, err := intEnv(getenv, "RECOVERY_BATCH", 20)
	if err != nil {
		return rc, err
	}
	rc.Batch = int(n)
	if n, err = intEnv(getenv, "RECOVERY_MAX_ATTEMPTS", 5); err != nil {
		return rc, err
	}
	rc.MaxAttempts = int(n)
	rc.MaxPolls = 5
	if v := getenv("RECOVERY_MAX_POLLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 30 {
			return rc, fmt.Errorf("RECOVERY_MAX_POLLS: %q is not a whole number from 0 to 30", v)
		}
		rc.MaxPolls = n
	}
	calls := or(getenv("PROVIDER_IDEMPOTENT_CALLS"), getenv("PROVIDER_IDEMPOTENT"))
	switch calls {
	case "", "true":
	case "false":
		rc.IdempotentCalls = false
	default:
		return rc, fmt.Errorf("PROVIDER_IDEMPOTENT_CALLS: %q is neither true nor false", calls)
	}
	return rc, nil
}

// newRecoveryLoop builds the recovery loop for this instance: claims on
// policy_operations, the cancellation recoverer, metrics on reg.
func newRecoveryLoop(cfg config, canceller *policies.Canceller, logger *slog.Logger, reg prometheus.Registerer) *recovery.Loop {
	rc := cfg.Recovery
	maxPolls := rc.MaxPolls
	if maxPolls == 0 {
		maxPolls = recovery.NoPolling
	}
	rec := policies.NewRecovery(canceller)
	loop := recovery.New(rec, recovery.Config{
		Interval:     rc.Interval,
		BatchSize:    rc.Batch,
		Strategy:     rc.Claim,
		Instance:     cfg.InstanceID,
		Lease:        cfg.OperationLease,
		MaxPolls:     maxPolls,
		PollInterval: rc.PollInterval,
		MaxAttempts:  rc.MaxAttempts,
		Backoff:      rc.Backoff,
		RetryUnknown: &rc.IdempotentCalls,
		Logger:       logger.With("component", "recovery"),
		Registerer:   reg,
	})
	loop.Register(policies.OperationCancel, rec)
	return loop
}

// recoverOnly is `web recover`: the recovery loop alone, for a worker
// process next to (or instead of) the loops inside `web serve`. It needs
// PROVIDER_URL: there is no in-process provider to reach.
func recoverOnly(ctx context.Context, cfg config, logger *slog.Logger, stdout io.Writer) error {
	if cfg.ProviderURL == "" {
		return errors.New("web recover needs PROVIDER_URL: the provider the app instances call")
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = "recover"
	}
	pool, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer migrator.Close()
	client := provider.NewHTTPClient(cfg.ProviderURL, cfg.ProviderTimeout)
	defer client.CloseIdleConnections()
	loop := newRecoveryLoop(cfg, policies.NewCanceller(pool, client, cfg.OperationLease), logger, nil)
	fmt.Fprintf(stdout, "recovery loop %q running (%s every %s)\n", cfg.InstanceID, cfg.Recovery.Claim, cfg.Recovery.Interval)
	loop.Run(ctx)
	return nil
}
