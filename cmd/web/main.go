// Command web is idemlab: the web application, its migrations, and (as
// subcommands) the fake external systems and the recovery loop on their own.
//
//	web [serve]              the app (default)
//	web provider             the fake provider alone
//	web payments             the fake payments service alone
//	web recover              the recovery loop alone (needs PROVIDER_URL)
//	web events               the events' relay and consumers alone
//	web kafka                the embedded Kafka broker alone (KAFKA_ADDR, KAFKA_DATA_DIR)
//	web tasks                the fake task queue alone (TASKS_ADDR)
//	web migrate up|down|status
//	web user set NAME [-role customer|admin] [-token]
//	                         credentials outside demo mode (PASSWORD from the environment)
//	web healthcheck          exit 0 when this instance's /healthz answers 200
//
// main only calls run; tests call run too, on port 0.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "web:", err)
		os.Exit(1)
	}
}
