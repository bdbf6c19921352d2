// Command chaos runs idemlab as it would run in production — two `web
// serve` instances, the fake provider as its own process, a PostgreSQL of
// their own — and, while clients cancel policies and book slots through
// it, breaks things: SIGKILL (at random and at crash points), SIGSTOP
// pauses, delays and held calls between the app and the provider, fault
// modes flipped (including phases where the provider is not idempotent, the
// app told so), immediate database restarts. Then it heals everything,
// lets the system drain, and checks what was promised: the app's own
// invariants and, from the clients' records, that every intent got one
// final answer that replays byte for byte and means what the end state
// says.
//
//	go run ./cmd/chaos -duration 2m -seed 7      (make chaos)
//
// It prints the figures, writes an HTML report with a timeline to the
// -out folder (with every process's log, the history as JSON and the
// violations), and exits 1 if anything was violated.
//
// The parts, one package each: cluster (the private database), procs
// (building and supervising the processes), nemesis (the faults), workload
// (the clients), history (what was recorded), check (the verdict), report
// (figures and plot). This file wires them in order.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK        = 0
	exitViolation = 1 // the run found violations
	exitHarness   = 2 // the run could not be made (build, start, flags)
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return exitHarness
	}
	if len(cfg.Rotation) == 1 {
		return runOne(ctx, cfg, stdout, stderr)
	}
	// EVENTS_TRANSPORT rotated: one whole run per transport, in turn (a
	// transport's outbox rows are relayed only by its own relay, so
	// switching mid-run would strand them), each in -out/<transport>.
	worst, out := exitOK, cfg.Out
	for _, t := range cfg.Rotation {
		cfg.Transport, cfg.Out = t, filepath.Join(out, t)
		fmt.Fprintf(stdout, "chaos: -transport %s (%s)\n", t, cfg.Out)
		code := runOne(ctx, cfg, stdout, stderr)
		fmt.Fprintf(stdout, "chaos: -transport %s: %s\n", t, map[int]string{exitOK: "no violations",
			exitViolation: "VIOLATIONS", exitHarness: "the run could not be made"}[code])
		worst = max(worst, code)
		if ctx.Err() != nil {
			break
		}
	}
	return worst
}

// runOne is one run on cfg.Transport.
func runOne(ctx context.Context, cfg config, stdout, stderr io.Writer) int {
	r, err := newRun(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		if r != nil {
			r.close()
		}
		return exitHarness
	}
	defer r.close()
	violations, err := r.execute(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitHarness
	}
	if violations > 0 {
		return exitViolation
	}
	return exitOK
}
