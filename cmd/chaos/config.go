package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/idemlab/idemlab/internal/events"
)

// config is the command line.
type config struct {
	Duration time.Duration // how long faults are injected
	Drain    time.Duration // how long the drain may take before the run gives up
	Seed     uint64
	Out      string // the run's folder
	Bin      string // a built web binary; "" builds ./cmd/web
	Quiet    bool
	Keep     bool // leave the system running after the checks, to study it

	Instances  int // app instances (replicas) on the one database
	Clients    int
	Timeout    time.Duration // each client attempt's timeout
	DoubleSend float64
	// StopChance: the chance an admin cancels a live operation a cancel left in progress.
	StopChance float64
	Users      int
	Policies   int // per user
	Slots      int

	KillEvery          time.Duration
	CrashShare         float64
	HoldShare          float64
	NotIdempotentShare float64
	PauseEvery         time.Duration
	DelayEvery         time.Duration
	FlipEvery          time.Duration
	DBEvery            time.Duration
	FailoverEvery      time.Duration // 0: one database server, no failover
	NATSNodes          int           // nats-servers routed as one JetStream cluster (EVENTS_REPLICAS)
	NATSKillEvery      time.Duration // SIGKILL of one NATS node (0: none)
	CallbackEvery      time.Duration // a new callback mode at a fake (0: -callbacks throughout)
	ReorderEvery       time.Duration // the history consumer's next deliveries sent back (0: none)

	// The app's settings for the run: short leases and quick recovery, so
	// a 1–4 s pause outlives a lease and a handed-over operation is
	// finished within the run.
	Lease            time.Duration
	ProviderTimeout  time.Duration
	RecoveryInterval time.Duration
	AppEnv           []string // extra KEY=value for the app instances
	Callbacks        string   // the fakes' callback mode (off: none; the fakes call app-1 back)
	Transport        string   // EVENTS_TRANSPORT of this run: nats (a private nats-server), river, kafka (`web kafka`) or tasks (`web tasks`)
	Rotation         []string // the transports of -transport, one whole run each, in turn (Transport is the current one)
}

// envFlags collects repeated -env KEY=value.
type envFlags []string

func (e *envFlags) String() string { return strings.Join(*e, " ") }
func (e *envFlags) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("-env wants KEY=value, got %q", v)
	}
	*e = append(*e, v)
	return nil
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&c.Duration, "duration", 2*time.Minute, "how long the nemesis injects faults")
	fs.DurationVar(&c.Drain, "drain", 3*time.Minute, "how long the system may take to answer every intent and finish every operation after the heal")
	fs.Uint64Var(&c.Seed, "seed", 1, "seeds every random choice of the nemesis and the clients")
	fs.StringVar(&c.Out, "out", "tmp/chaos", "folder for the report, the history and the processes' logs (emptied first)")
	fs.StringVar(&c.Bin, "bin", "", "a built web binary to run (default: build ./cmd/web of this tree)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no progress lines")
	fs.BoolVar(&c.Keep, "keep", false, "after the checks, leave the system running (addresses printed) until Ctrl-C")

	fs.IntVar(&c.Instances, "instances", 2, "app instances (replicas) on the one database, each killed, paused and restarted by the nemesis")
	fs.IntVar(&c.Clients, "clients", 8, "clients acting at once")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "each client attempt's timeout")
	fs.Float64Var(&c.DoubleSend, "double-send", 0.1, "chance that an intent's first attempt is sent twice at once, to two instances")
	fs.Float64Var(&c.StopChance, "stop", 0.3, "chance that an admin cancels a live operation a customer's cancel left in progress (answered 202)")
	// Enough for about 15 minutes: about 5 cancellations a second use up
	// policies, and the 5 % of bookings never released use up slots.
	fs.IntVar(&c.Users, "users", 100, "customers in the dataset")
	fs.IntVar(&c.Policies, "policies-per-user", 100, "policies per customer (each cancelled at most once; at most 100)")
	fs.IntVar(&c.Slots, "slots", 2000, "slots in the dataset")

	fs.DurationVar(&c.KillEvery, "kill-every", 2500*time.Millisecond, "mean time between SIGKILLs (0: none)")
	fs.Float64Var(&c.CrashShare, "crash-share", 0.3, "share of app kills made at a crash point")
	fs.Float64Var(&c.HoldShare, "hold-share", 1.0/3, "share of network windows that hold the next calls past PROVIDER_TIMEOUT instead of delaying traffic")
	fs.Float64Var(&c.NotIdempotentShare, "not-idempotent-share", 1.0/3, "share of fault flips that make a fake not idempotent (the app told first)")
	fs.DurationVar(&c.PauseEvery, "pause-every", 10*time.Second, "mean time between SIGSTOP pauses (0: none)")
	fs.DurationVar(&c.DelayEvery, "delay-every", 10*time.Second, "mean time between network delay windows (0: none)")
	fs.DurationVar(&c.FlipEvery, "flip-every", 8*time.Second, "mean time between fault-mode flips (0: none)")
	fs.DurationVar(&c.DBEvery, "db-every", 10*time.Second, "mean time between database restarts (0: none)")
	fs.IntVar(&c.NATSNodes, "nats-nodes", 1, "nats-servers routed as one JetStream cluster, the stream on every one (EVENTS_REPLICAS): 1, 3 or 5")
	fs.DurationVar(&c.NATSKillEvery, "nats-kill-every", 0, "mean time between SIGKILLs of one NATS node, restarted after 1–4 s (0: none; with -nats-nodes 3 or 5)")
	fs.DurationVar(&c.FailoverEvery, "failover-every", 0, "mean time between PostgreSQL failovers: the primary killed, its synchronous standby promoted, a new standby made (0: one server, none)")

	fs.DurationVar(&c.Lease, "lease", 2*time.Second, "IDEMPOTENCY_LEASE and OPERATION_LEASE of the app")
	fs.DurationVar(&c.ProviderTimeout, "provider-timeout", time.Second, "PROVIDER_TIMEOUT and PAYMENTS_TIMEOUT of the app")
	fs.DurationVar(&c.RecoveryInterval, "recovery-interval", 250*time.Millisecond, "RECOVERY_INTERVAL of the app")
	fs.StringVar(&c.Transport, "transport", events.TransportNATS, "EVENTS_TRANSPORT of the app: "+strings.Join(events.Transports, " or ")+
		" (nats: the run starts its own nats-server; kafka, tasks: `web kafka`, `web tasks` as a process of their own); "+
		"a comma-separated list, or all, rotates it: one whole run per transport, in turn, each in its own folder under -out")
	fs.StringVar(&c.Callbacks, "callbacks", "ok", "the fakes' callback mode at the start: off, ok, duplicate, delay, reorder or lost (docs/provider.md); "+
		"on, both fakes call app-1 back at POST /webhooks/{system}, racing recovery for every step whose outcome is unknown")
	fs.DurationVar(&c.CallbackEvery, "callback-every", 8*time.Second, "mean time between callback-mode changes at a fake, drawn from ok, duplicate, delay, reorder and lost (0: -callbacks throughout)")
	fs.DurationVar(&c.ReorderEvery, "reorder-every", 6*time.Second, "mean time between armings of the events' out_of_order injector for the next 3–12 deliveries to the history consumer (0: none)")
	fs.Var((*envFlags)(&c.AppEnv), "env", "extra KEY=value for the app instances (repeatable)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.Transport == "all" {
		c.Transport = strings.Join(events.Transports, ",")
	}
	c.Rotation = strings.Split(c.Transport, ",")
	c.Transport = c.Rotation[0]
	for _, t := range c.Rotation {
		if !slices.Contains(events.Transports, t) {
			err := fmt.Errorf("-transport %q: want %s, a comma-separated list of them, or all", t, strings.Join(events.Transports, " or "))
			fmt.Fprintln(stderr, "chaos:", err)
			return c, err
		}
	}
	if c.NATSNodes != 1 && c.NATSNodes != 3 && c.NATSNodes != 5 || c.NATSKillEvery > 0 && c.NATSNodes == 1 {
		err := fmt.Errorf("-nats-nodes must be 1, 3 or 5, and -nats-kill-every needs 3 or 5 (one node lost keeps a majority)")
		fmt.Fprintln(stderr, "chaos:", err)
		return c, err
	}
	if c.Clients < 1 || c.Duration <= 0 || c.Users < 1 || c.Slots < 1 || c.Instances < 1 || c.Instances > 9 {
		err := fmt.Errorf("-clients, -duration, -users and -slots must be positive, -instances from 1 to 9")
		fmt.Fprintln(stderr, "chaos:", err)
		return c, err
	}
	return c, nil
}

// webhookSecret signs the fakes' callbacks; the apps and the fakes share it.
const webhookSecret = "chaos-run-webhook-secret"

// appEnv is the environment of every app instance (ADDR and INSTANCE_ID
// are added per instance).
func (c config) appEnv(dbURL string) []string {
	env := []string{
		"DATABASE_URL=" + dbURL,
		"DEMO_MODE=true",                // the reset, the demo admin token and the crash switch
		"RATE_LIMIT_EXEMPT=127.0.0.1/8", // the clients are a load generator on this machine
		"LOG_FORMAT=json",
		"SESSION_SECRET=chaos-run-shared-secret-0123456789",
		"SHUTDOWN_GRACE=2s",
		"IDEMPOTENCY_LEASE=" + c.Lease.String(),
		"OPERATION_LEASE=" + c.Lease.String(),
		"PROVIDER_TIMEOUT=" + c.ProviderTimeout.String(),
		"PAYMENTS_TIMEOUT=" + c.ProviderTimeout.String(),
		"RECOVERY_INTERVAL=" + c.RecoveryInterval.String(),
		"RECOVERY_POLL_INTERVAL=100ms",
		"RECOVERY_BACKOFF=200ms",
		// Backoffs and the re-asking of operations waiting for a person
		// compressed like the leases (5m and 30s in production), so what
		// the faults sent to a person is asked again within the drain.
		"RECOVERY_MAX_BACKOFF=10s",
		"RECOVERY_REASK_INTERVAL=2s",
		"PROVIDER_IDEMPOTENT_CALLS=true",
		"WEBHOOK_SECRET=" + webhookSecret,
	}
	return append(env, c.AppEnv...)
}

// settings lists the run's knobs for the report.
func (c config) settings() []string {
	return []string{
		fmt.Sprintf("duration=%s drain=%s seed=%d", c.Duration, c.Drain, c.Seed),
		fmt.Sprintf("instances=%d clients=%d timeout=%s double-send=%.2f stop=%.2f users=%d policies-per-user=%d slots=%d", c.Instances, c.Clients, c.Timeout, c.DoubleSend, c.StopChance, c.Users, c.Policies, c.Slots),
		fmt.Sprintf("kill-every=%s crash-share=%.2f pause-every=%s delay-every=%s hold-share=%.2f flip-every=%s not-idempotent-share=%.2f db-every=%s failover-every=%s nats-nodes=%d nats-kill-every=%s",
			c.KillEvery, c.CrashShare, c.PauseEvery, c.DelayEvery, c.HoldShare, c.FlipEvery, c.NotIdempotentShare, c.DBEvery, c.FailoverEvery, c.NATSNodes, c.NATSKillEvery),
		fmt.Sprintf("EVENTS_TRANSPORT=%s callbacks=%s callback-every=%s reorder-every=%s", c.Transport, c.Callbacks, c.CallbackEvery, c.ReorderEvery),
		fmt.Sprintf("IDEMPOTENCY_LEASE=OPERATION_LEASE=%s PROVIDER_TIMEOUT=PAYMENTS_TIMEOUT=%s RECOVERY_INTERVAL=%s %s", c.Lease, c.ProviderTimeout, c.RecoveryInterval, strings.Join(c.AppEnv, " ")),
	}
}
