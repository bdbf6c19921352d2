package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/pause"
)

// runState is what one run shares between its clients.
type runState struct {
	cfg       config
	c         *client
	d         *dataset
	rec       *recorder
	nonce     string    // makes this run's keys unlike any earlier run's
	completed []request // replay: requests whose keys completed
}

// errFailed: the run found something broken; the report says what.
var errFailed = errors.New("FAIL")

// run is the whole program: reset, drive the workload for -duration, wait
// for recovery to drain, ask for the invariants' verdict, report. It
// returns errFailed (exit status 1) when anything broke.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return err
	}
	sc := scenarios[cfg.Scenario]
	rec := newRecorder()
	c := newClient(cfg, rec)
	defer c.close()

	d, err := loadDataset(ctx, c, cfg)
	if err != nil {
		return err
	}
	r := &runState{cfg: cfg, c: c, d: d, rec: rec, nonce: strconv.FormatInt(time.Now().UnixNano(), 36)}
	if sc.faults != nil {
		if err := c.admin(ctx, "PUT", "/api/v1/provider/faults", sc.faults, nil); err != nil {
			return fmt.Errorf("set provider faults: %w", err)
		}
	}
	if sc.paymentsFaults != nil {
		if err := c.admin(ctx, "PUT", "/api/v1/payments/faults", sc.paymentsFaults, nil); err != nil {
			return fmt.Errorf("set payments faults: %w", err)
		}
	}
	if sc.prepare != nil {
		if err := sc.prepare(ctx, r); err != nil {
			return err
		}
	}

	if cfg.Warmup > 0 {
		r.drive(ctx, sc, cfg.Warmup, stderr)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rec.startMeasuring()
	}
	if cfg.Vacuum != "" {
		if err := vacuum(ctx, cfg.Vacuum); err != nil {
			return err
		}
	}
	costPids, err := parseCostPids(cfg.CostPids)
	if err != nil {
		return err
	}
	var costStart costSample
	if len(costPids) > 0 {
		costStart.cpu = sampleCPU(costPids)
		if cfg.Vacuum != "" {
			if err := sampleDB(ctx, cfg.Vacuum, &costStart); err != nil {
				return err
			}
		}
	}
	res := r.drive(ctx, sc, cfg.Duration, stderr)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if len(costPids) > 0 {
		costEnd := costSample{cpu: sampleCPU(costPids)}
		if cfg.Vacuum != "" {
			time.Sleep(statsSettle) // the window's last statistics reach the counters
			if err := sampleDB(ctx, cfg.Vacuum, &costEnd); err != nil {
				return err
			}
		}
		res.cost = costOf(costStart, costEnd, rec.answered2xx())
	}

	// Faults stop; the promise is that every operation then finishes.
	if sc.faults != nil {
		if err := c.admin(ctx, "PUT", "/api/v1/provider/faults", healthyProvider, nil); err != nil {
			return fmt.Errorf("heal provider: %w", err)
		}
	}
	if sc.paymentsFaults != nil {
		if err := c.admin(ctx, "PUT", "/api/v1/payments/faults", healthyProvider, nil); err != nil {
			return fmt.Errorf("heal payments: %w", err)
		}
	}
	res.settle, err = waitSettled(ctx, c, cfg.Settle)
	if err != nil {
		return err
	}
	res.verdict, err = fetchInvariants(ctx, c, "")
	if err != nil {
		return err
	}
	rep := newReport(cfg, sc, d, rec, res)
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.print(stdout)
	}
	if !rep.Pass {
		return errFailed
	}
	return nil
}

// driveResult is what the clock measured.
type driveResult struct {
	cost      *cost // with -cost-pids
	elapsed   time.Duration
	exhausted bool // clients stopped early: no ACTIVE policy left
	settle    settleResult
	verdict   verdict
}

// drive runs cfg.Concurrency clients until d passes (an intent under way
// finishes: its requests are part of the run) or the policies run out.
func (r *runState) drive(ctx context.Context, sc *scenario, d time.Duration, stderr io.Writer) driveResult {
	deadline := time.Now().Add(d)
	start := time.Now()
	stopProgress := startProgress(stderr, r.rec, start, d)
	var exhausted atomic.Bool
	var wg sync.WaitGroup
	for i := range r.cfg.Concurrency {
		w := &worker{id: i, rng: rand.New(rand.NewPCG(r.cfg.Seed, uint64(i)+1)), c: r.c, d: r.d, rec: r.rec, run: r}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				if err := sc.pick(w.rng)(ctx, w); errors.Is(err, errExhausted) {
					exhausted.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	return driveResult{elapsed: elapsed, exhausted: exhausted.Load()}
}

// verdict is the answer of GET /api/v1/invariants, kept whole for -json:
// the app's own report type, so the tool and the endpoint cannot drift.
type verdict = invariants.Report

// live counts operations someone is still working on.
func live(v verdict) int64 {
	return v.Counts.OperationsByStatus["IN_PROGRESS"] + v.Counts.OperationsByStatus["RECOVERING"]
}

func fetchInvariants(ctx context.Context, c *client, query string) (verdict, error) {
	var v verdict
	err := c.admin(ctx, "GET", "/api/v1/invariants"+query, nil, &v)
	return v, err
}

// settleResult says whether live operations finished in time.
type settleResult struct {
	waited time.Duration
	live   int64 // still IN_PROGRESS or RECOVERING when the wait ended
}

// waitSettled polls the invariants' counts until no operation is live or
// max passes. While waiting it asks with stale_after=0: an operation
// recovery has not reached yet is expected now, not a violation.
func waitSettled(ctx context.Context, c *client, max time.Duration) (settleResult, error) {
	start := time.Now()
	for {
		v, err := fetchInvariants(ctx, c, "?stale_after=0")
		if err != nil {
			return settleResult{}, err
		}
		res := settleResult{waited: time.Since(start), live: live(v)}
		if res.live == 0 || res.waited >= max {
			return res, nil
		}
		if !pause.For(ctx, 250*time.Millisecond) {
			return res, ctx.Err()
		}
	}
}
