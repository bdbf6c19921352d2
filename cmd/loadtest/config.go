package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"
)

// config is every flag. Only -url and -admin-token are needed to point the
// tool at an app; the rest have defaults that make a run of seconds.
type config struct {
	URL         string
	AdminToken  string
	Scenario    string
	Concurrency int
	Rate        float64 // requests per second across all clients; 0: no cap
	Duration    time.Duration
	Warmup      time.Duration // driven first and not measured (its failures still count)
	Seed        uint64

	// The dataset a reset creates.
	Users           int
	PoliciesPerUser int
	Slots           int
	Reset           bool
	// Vacuum, a database URL: after the reset and the warm-up, VACUUM ANALYZE
	// and CHECKPOINT that database before the clock starts — the same
	// preparation as the pgbench runs it is compared with (scripts/bench).
	Vacuum string
	// CostPids names the processes whose CPU the measured window is charged
	// with ("app=123,provider=456,postgres=789"; postgres: the postmaster,
	// its backends with it): the report's cost per operation (cost.go),
	// with the buffers and WAL of -vacuum's database.
	CostPids string

	// Settle is how long the end of the run waits for live operations to
	// finish (recovery draining) before it reads the verdict.
	Settle time.Duration
	// JSON prints the report as one JSON object (for scripts such as bench).
	JSON bool
}

// Bounds keep a run bounded in count and time whatever the flags say.
const (
	maxConcurrency = 1024
	maxDuration    = 30 * time.Minute
)

// usageError is a bad command line: exit status 2.
type usageError struct {
	err  error
	help bool // -h: the usage was printed, nothing went wrong
}

func (e usageError) Error() string { return e.err.Error() }

func parseConfig(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.URL, "url", "http://localhost:8080", "the app's base URL")
	fs.StringVar(&c.AdminToken, "admin-token", "demo-admin", "the admin's API token")
	fs.StringVar(&c.Scenario, "scenario", "mixed", "what to send: "+strings.Join(scenarioNames(), ", "))
	fs.IntVar(&c.Concurrency, "concurrency", 16, "clients sending at once")
	fs.Float64Var(&c.Rate, "rate", 0, "cap on requests per second across all clients (0: no cap)")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long to send")
	fs.DurationVar(&c.Warmup, "warmup", 0, "drive the workload this long first, unmeasured (a 5xx or an anomaly in it still fails the run): "+
		"the tables grow past their empty start before -vacuum's ANALYZE, so the plans the app's connections cache fit the data")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of every random choice (same seed, same choices)")
	fs.IntVar(&c.Users, "users", 200, "generated users in the reset dataset")
	fs.IntVar(&c.PoliciesPerUser, "policies-per-user", 50, "policies each customer owns after the reset")
	fs.IntVar(&c.Slots, "slots", 8, "slots after the reset (few slots: contention)")
	fs.BoolVar(&c.Reset, "reset", true, "reset the app's data first (POST /api/v1/admin/reset; the app needs DEMO_MODE=true); "+
		"false: use the demo customers (tokens demo-alice, demo-bob, demo-carol) and the data as it is")
	fs.StringVar(&c.Vacuum, "vacuum", "", "a database URL: after the reset (and -warmup), VACUUM ANALYZE and CHECKPOINT it before the clock starts "+
		"(the app's database; as scripts/bench does before each pgbench run)")
	fs.StringVar(&c.CostPids, "cost-pids", "", "name=pid,…: report the measured window's CPU per 2xx answer for each process (postgres=the postmaster: "+
		"its backends too), and with -vacuum the database's buffers and WAL per answer")
	fs.DurationVar(&c.Settle, "settle", 60*time.Second, "at the end, how long to wait for live operations to finish (recovery to drain)")
	fs.BoolVar(&c.JSON, "json", false, "print the report as one JSON object on stdout")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: loadtest [flags]\n\nDrives idemlab's API, then prints the answers and the verdict of GET /api/v1/invariants.\nExit status 1 when anything broke (docs/performance.md).\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, usageError{err: err, help: errors.Is(err, flag.ErrHelp)}
	}
	if fs.NArg() > 0 {
		return c, usageError{err: fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if err := c.validate(); err != nil {
		return c, usageError{err: err}
	}
	return c, nil
}

func (c *config) validate() error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-url %q: want http://host:port", c.URL)
	}
	c.URL = strings.TrimRight(c.URL, "/")
	switch {
	case scenarios[c.Scenario] == nil:
		return fmt.Errorf("-scenario %q: want one of %s", c.Scenario, strings.Join(scenarioNames(), ", "))
	case c.Concurrency < 1 || c.Concurrency > maxConcurrency:
		return fmt.Errorf("-concurrency %d: want 1 to %d", c.Concurrency, maxConcurrency)
	case c.Rate < 0:
		return fmt.Errorf("-rate %g: want 0 (no cap) or more", c.Rate)
	case c.Duration <= 0 || c.Duration > maxDuration:
		return fmt.Errorf("-duration %s: want more than 0 and at most %s", c.Duration, maxDuration)
	case c.Warmup < 0 || c.Warmup > maxDuration:
		return fmt.Errorf("-warmup %s: want 0 to %s", c.Warmup, maxDuration)
	case c.Settle < 0:
		return fmt.Errorf("-settle %s: want 0 or more", c.Settle)
	case c.AdminToken == "":
		return errors.New("-admin-token is empty")
	}
	return nil
}

func scenarioNames() []string {
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return scenarios[names[i]].order < scenarios[names[j]].order })
	return names
}
