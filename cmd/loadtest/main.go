// Command loadtest drives idemlab's JSON API with the traffic that breaks
// naive implementations — the same request sent several times with one key,
// two keys for one intent, many users on a few slots, a provider that times
// out — and then asks the app, through GET /api/v1/invariants, whether any
// promise broke. It needs nothing but the app's URL and the admin token.
//
//	loadtest -scenario retry-storm -concurrency 16 -duration 20s
//
// Scenarios (scenarios.go): retry-storm, double-click, slot-race, timeouts,
// mixed; and three single-purpose workloads make bench measures: cancel,
// replay, book.
//
// Exit status: 0 when the run passed; 1 when an invariant is violated, the
// app answered a 5xx or did not answer at all, two answers for one key
// disagreed, or recovery did not drain within -settle; 2 on bad flags.
//
// main only calls run; the smoke test calls run too.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	var usage usageError
	switch {
	case err == nil:
	case errors.As(err, &usage):
		if !usage.help {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
		}
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}
