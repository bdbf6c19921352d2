package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/internal/web"
)

// config is everything the environment can set. Every field has a default
// that works for `make run` against a local PostgreSQL; docs/api.md lists them.
type config struct {
	DatabaseURL string // DATABASE_URL
	// DatabaseDirectURL (DATABASE_DIRECT_URL) is the database itself when
	// DATABASE_URL goes through a pooler in transaction mode (PgBouncer):
	// what needs a session of its own — the migrations' advisory lock, the
	// relay's LISTEN — uses it. Default DATABASE_URL (docs/scaling.md).
	DatabaseDirectURL string
	Addr              string // ADDR, the app's listen address
	DBMaxConns        int32  // DB_MAX_CONNS, the pool size
	// FakeDBMaxConns sizes each in-process fake's own pool
	// (FAKE_DB_MAX_CONNS, default DB_MAX_CONNS): an external system shares
	// nothing with the app but the database server, and a fake smaller than
	// the app would make every benchmark measure the fake.
	FakeDBMaxConns int32
	LogLevel       slog.Level
	LogFormat      string // LOG_FORMAT: text or json
	// SessionSecret binds CSRF tokens to sessions (SESSION_SECRET). Unset,
	// the secret kept in the database is used (users.ServerSecret).
	SessionSecret string
	DemoTokens    string // DEMO_TOKENS: name=token,… overrides
	InstanceID    string // INSTANCE_ID: names this replica in logs and pages
	BodyLimit     string // BODY_LIMIT: largest request body, e.g. 1M
	// TrustedProxies are the proxies whose X-Forwarded-For and
	// X-Forwarded-Proto are believed (TRUSTED_PROXIES: addresses or CIDR
	// ranges, comma-separated). None by default: both headers are ignored.
	TrustedProxies []*net.IPNet
	// RateLimits are RATE_LIMIT_SIGNIN, _BAD_TOKEN, _WRITES_PER_USER,
	// _WRITES_PER_ADDRESS, _LABS ("10/m", "off") and RATE_LIMIT_EXEMPT
	// (addresses never limited: a load generator's host).
	RateLimits    web.RateLimits
	ShutdownGrace time.Duration
	// PasswordCost is bcrypt's work factor for passwords (PASSWORD_COST,
	// default users.PasswordCost, 12). The tests set bcrypt's minimum, 4:
	// under the race detector a hash at 12 is seconds of CPU.
	PasswordCost int

	// The provider. With ProviderURL empty the fake provider runs in this
	// process on ProviderAddr, and the app still calls it over HTTP.
	ProviderURL        string        // PROVIDER_URL
	ProviderAddr       string        // PROVIDER_ADDR
	ProviderTimeout    time.Duration // PROVIDER_TIMEOUT: how long one provider call may take
	ProviderFaultMode  string        // PROVIDER_FAULT_MODE: the global fault mode set at start
	ProviderIdempotent string        // PROVIDER_IDEMPOTENT: true|false, set at start

	// The payments service, wired like the provider (fakes.go).
	PaymentsURL        string        // PAYMENTS_URL
	PaymentsAddr       string        // PAYMENTS_ADDR
	PaymentsTimeout    time.Duration // PAYMENTS_TIMEOUT: how long one payments call may take
	PaymentsFaultMode  string        // PAYMENTS_FAULT_MODE: the global fault mode set at start
	PaymentsIdempotent string        // PAYMENTS_IDEMPOTENT: true|false, set at start
	// DepositHold is how long a deposit booking's hold is meant to last
	// (DEPOSIT_HOLD, 10m): past it, a hold whose charge is known never made
	// expires; one whose charge is unknown stays (docs/saga.md).
	DepositHold time.Duration

	// The Redis lab's Redis (REDIS_URL) and the redis-server binary it
	// starts privately to restart one without persistence (REDIS_SERVER).
	RedisURL    string
	RedisServer string
	// PostgresBinDir is where the failover lab finds PostgreSQL's server
	// binaries (POSTGRES_BIN_DIR; "" = the newest Debian folder).
	PostgresBinDir string

	// FakeControlToken (FAKE_CONTROL_TOKEN), when set, is the bearer token
	// the fakes' control APIs require and the app's control clients send;
	// unset, those APIs answer loopback callers only.
	FakeControlToken string

	// WebhookSecret (WEBHOOK_SECRET) signs the fakes' callbacks and checks
	// them at POST /webhooks/{system}; unset, the secret kept in the
	// database (users.ServerSecret "webhook"), which replicas share.
	// WebhookURL (WEBHOOK_URL) is where a fake sends them: unset, the
	// in-process fakes call this instance back, and a fake run alone
	// (`web provider`) sends none.
	WebhookSecret string
	WebhookURL    string

	IdempotencyLease time.Duration // IDEMPOTENCY_LEASE: how long a request owns its key
	IdempotencyTTL   time.Duration // IDEMPOTENCY_TTL: how long completed keys are replayed
	// OPERATIONS_RETENTION: how long finished operations are kept (internal/operations)
	OperationsRetention time.Duration
	OperationLease      time.Duration // OPERATION_LEASE: how long a request owns its operation

	// CrashAt makes the process die at a point of the cancellation
	// (CRASH_AT=after_claim|after_provider_call|after_commit); CrashMode is
	// exit (SIGKILL itself) or abandon (end only the request).
	CrashAt   string
	CrashMode string

	// DemoMode (DEMO_MODE=true) makes this a demo: the demo accounts with
	// their known tokens, one-click "sign in as", the data reset and the
	// crash switch. Off by default: a binary started without it is run for
	// real, and people sign in with passwords (docs/api.md "Demo mode").
	DemoMode bool
	// Recovery is the recovery loop's configuration (RECOVERY_*,
	// OPERATION_LEASE): internal/recovery reads and validates it.
	Recovery recovery.Config
	Events   eventsConfig // EVENTS_*, NATS_URL (events.go)
	// Beliefs is what the app is told at start about each external system's
	// idempotency (PROVIDER_IDEMPOTENT_CALLS, PAYMENTS_IDEMPOTENT_CALLS,
	// each defaulting to the fake's own switch PROVIDER_IDEMPOTENT /
	// PAYMENTS_IDEMPOTENT). A system not named keeps what the database says.
	Beliefs       map[string]bool
	beliefSources map[string]string // system → the variable its belief came from
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL:       cmp.Or(getenv("DATABASE_URL"), "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		DatabaseDirectURL: getenv("DATABASE_DIRECT_URL"),
		Addr:              cmp.Or(getenv("ADDR"), ":8080"),
		LogFormat:         cmp.Or(getenv("LOG_FORMAT"), "text"),
		SessionSecret:     getenv("SESSION_SECRET"),
		DemoTokens:        getenv("DEMO_TOKENS"),
		InstanceID:        getenv("INSTANCE_ID"),
		BodyLimit:         cmp.Or(getenv("BODY_LIMIT"), "1M"),

		ProviderURL:        getenv("PROVIDER_URL"),
		ProviderAddr:       cmp.Or(getenv("PROVIDER_ADDR"), ":8081"),
		ProviderFaultMode:  getenv("PROVIDER_FAULT_MODE"),
		ProviderIdempotent: getenv("PROVIDER_IDEMPOTENT"),

		PaymentsURL:        getenv("PAYMENTS_URL"),
		PaymentsAddr:       cmp.Or(getenv("PAYMENTS_ADDR"), ":8082"),
		PaymentsFaultMode:  getenv("PAYMENTS_FAULT_MODE"),
		PaymentsIdempotent: getenv("PAYMENTS_IDEMPOTENT"),
		FakeControlToken:   getenv("FAKE_CONTROL_TOKEN"),
		WebhookSecret:      getenv("WEBHOOK_SECRET"),
		WebhookURL:         getenv("WEBHOOK_URL"),
		RedisURL:           cmp.Or(getenv("REDIS_URL"), "redis://127.0.0.1:6379/0"),
		RedisServer:        cmp.Or(getenv("REDIS_SERVER"), "redis-server"),
		PostgresBinDir:     getenv("POSTGRES_BIN_DIR"),

		CrashAt:   getenv("CRASH_AT"),
		CrashMode: cmp.Or(getenv("CRASH_MODE"), string(crash.Exit)),
	}
	var err error
	switch v := getenv("DEMO_MODE"); v {
	case "", "false":
	case "true":
		c.DemoMode = true
	default:
		return c, fmt.Errorf("DEMO_MODE: %q is neither true nor false", v)
	}
	if c.CrashAt != "" && !c.DemoMode {
		return c, errors.New("CRASH_AT: crash points are for demos and tests; set DEMO_MODE=true")
	}
	if _, err = web.ParseBodyLimit(c.BodyLimit); err != nil {
		return c, err
	}
	if c.TrustedProxies, err = parseNets(getenv("TRUSTED_PROXIES")); err != nil {
		return c, fmt.Errorf("TRUSTED_PROXIES: %w", err)
	}
	if c.RateLimits, err = loadRateLimits(getenv); err != nil {
		return c, err
	}
	if c.DBMaxConns, err = intEnv(getenv, "DB_MAX_CONNS", 8); err != nil {
		return c, err
	}
	if c.FakeDBMaxConns, err = intEnv(getenv, "FAKE_DB_MAX_CONNS", c.DBMaxConns); err != nil {
		return c, err
	}
	if c.PasswordCost, err = passwordCostEnv(getenv); err != nil {
		return c, err
	}
	if c.ShutdownGrace, err = durationEnv(getenv, "SHUTDOWN_GRACE", 10*time.Second); err != nil {
		return c, err
	}
	if c.ProviderTimeout, err = durationEnv(getenv, "PROVIDER_TIMEOUT", 2*time.Second); err != nil {
		return c, err
	}
	if c.PaymentsTimeout, err = durationEnv(getenv, "PAYMENTS_TIMEOUT", 2*time.Second); err != nil {
		return c, err
	}
	if c.DepositHold, err = durationEnv(getenv, "DEPOSIT_HOLD", slots.DefaultHold); err != nil {
		return c, err
	}
	if c.IdempotencyLease, err = durationEnv(getenv, "IDEMPOTENCY_LEASE", 30*time.Second); err != nil {
		return c, err
	}
	if c.OperationsRetention, err = durationEnv(getenv, "OPERATIONS_RETENTION", 30*24*time.Hour); err != nil {
		return c, err
	}
	if c.IdempotencyTTL, err = durationEnv(getenv, "IDEMPOTENCY_TTL", 24*time.Hour); err != nil {
		return c, err
	}
	if c.Recovery, err = recovery.LoadConfig(getenv); err != nil {
		return c, err
	}
	if c.Events, err = loadEventsConfig(getenv, c.DatabaseURL); err != nil {
		return c, err
	}
	c.OperationLease = c.Recovery.Lease
	c.Beliefs, c.beliefSources = map[string]bool{}, map[string]string{}
	for system, names := range map[string][2]string{
		"provider": {"PROVIDER_IDEMPOTENT_CALLS", "PROVIDER_IDEMPOTENT"},
		"payments": {"PAYMENTS_IDEMPOTENT_CALLS", "PAYMENTS_IDEMPOTENT"},
	} {
		name := names[0]
		if getenv(name) == "" {
			name = names[1] // the fake's own switch, when the belief is not set apart from it
		}
		switch v := getenv(name); v {
		case "":
		case "true", "false":
			c.Beliefs[system], c.beliefSources[system] = v == "true", name
		default:
			return c, fmt.Errorf("%s: %q is neither true nor false", name, v)
		}
	}
	for name, v := range map[string]string{"PROVIDER_IDEMPOTENT": c.ProviderIdempotent, "PAYMENTS_IDEMPOTENT": c.PaymentsIdempotent} {
		if v != "" && v != "true" && v != "false" {
			return c, fmt.Errorf("%s: %q is neither true nor false", name, v)
		}
	}
	if err := c.LogLevel.UnmarshalText([]byte(cmp.Or(getenv("LOG_LEVEL"), "info"))); err != nil {
		return c, fmt.Errorf("LOG_LEVEL: %w", err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return c, fmt.Errorf("LOG_FORMAT: %q is neither text nor json", c.LogFormat)
	}
	return c, nil
}

func loadRateLimits(getenv func(string) string) (web.RateLimits, error) {
	rl := web.DefaultRateLimits
	for _, v := range []struct {
		name string
		dst  *web.Rate
	}{
		{"RATE_LIMIT_SIGNIN", &rl.SignIn},
		{"RATE_LIMIT_BAD_TOKEN", &rl.BadToken},
		{"RATE_LIMIT_WRITES_PER_USER", &rl.WritesPerUser},
		{"RATE_LIMIT_WRITES_PER_ADDRESS", &rl.WritesPerAddress},
		{"RATE_LIMIT_LABS", &rl.Labs},
	} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		r, err := web.ParseRate(s)
		if err != nil {
			return rl, fmt.Errorf("%s: %w", v.name, err)
		}
		*v.dst = r
	}
	var err error
	if rl.Exempt, err = parseNets(getenv("RATE_LIMIT_EXEMPT")); err != nil {
		return rl, fmt.Errorf("RATE_LIMIT_EXEMPT: %w", err)
	}
	return rl, nil
}

// parseNets reads "10.0.0.0/8, 192.0.2.7": CIDR ranges or single addresses.
func parseNets(spec string) ([]*net.IPNet, error) {
	var nets []*net.IPNet
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !strings.Contains(item, "/") {
			ip := net.ParseIP(item)
			if ip == nil {
				return nil, fmt.Errorf("%q is neither an address nor a CIDR range", item)
			}
			bits := 8 * len(ip.To16())
			if ip.To4() != nil {
				ip, bits = ip.To4(), 32
			}
			nets = append(nets, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
			continue
		}
		_, n, err := net.ParseCIDR(item)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a CIDR range", item)
		}
		nets = append(nets, n)
	}
	return nets, nil
}

func intEnv(getenv func(string) string, name string, def int32) (int32, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive whole number", name, v)
	}
	return int32(n), nil
}

// passwordCostEnv is PASSWORD_COST: a whole number in bcrypt's range.
func passwordCostEnv(getenv func(string) string) (int, error) {
	v := getenv("PASSWORD_COST")
	if v == "" {
		return users.PasswordCost, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < bcrypt.MinCost || n > bcrypt.MaxCost {
		return 0, fmt.Errorf("PASSWORD_COST: %q is not a bcrypt cost from %d to %d", v, bcrypt.MinCost, bcrypt.MaxCost)
	}
	return n, nil
}

func durationEnv(getenv func(string) string, name string, def time.Duration) (time.Duration, error) {
	v := getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: %q is not a positive duration such as 30s", name, v)
	}
	return d, nil
}
