package labs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/policies"
)

// Config is what the labs need from the environment.
type Config struct {
	// RedisURL is the Redis the Redis lab keeps its keys in (REDIS_URL).
	// Default redis://127.0.0.1:6379/0. When nothing answers there, the lab
	// runs on a private redis-server (RedisServer) instead.
	RedisURL string
	// RedisPrefix starts every key the labs write to that Redis. Default
	// "idemlab:labs:<database>:", so databases sharing one Redis (the
	// tests') never meet.
	RedisPrefix string
	// RedisServer is the redis-server binary the Redis lab starts, on a
	// free port of its own, to restart it without persistence
	// (REDIS_SERVER). Default "redis-server" from PATH.
	RedisServer string
	// PostgresBinDir holds the PostgreSQL server binaries the failover lab
	// runs a private primary and standby with (POSTGRES_BIN_DIR). Default:
	// the newest /usr/lib/postgresql/<version>/bin.
	PostgresBinDir string
	// Timeouts is what the timeout lab needs of the app (nil: that lab
	// answers ErrUnavailable).
	Timeouts *TimeoutsDeps
	Logger   *slog.Logger
}

// Labs runs labs and keeps their results. It is safe for concurrent use:
// every run has its own id, and everything a run writes carries it.
type Labs struct {
	pool  *pgxpool.Pool // the app's: a run's one transaction (key, result)
	lab   *pgxpool.Pool // search_path = labs: the scenarios' connections
	redis *redis.Client
	cfg   Config

	mu      sync.Mutex
	systems map[string]*fakeSystem // started on first use

	// failoverRun holds a token while the failover lab runs: its servers
	// are one run's at a time.
	failoverRun chan struct{}
}

// maxLabConns bounds the connections the scenarios use at once, so labs
// never starve the app's pool: they have a pool of their own.
const maxLabConns = 12

// New returns the labs over pool's database. It opens a pool of its own
// whose connections see the labs schema first (search_path = labs), and a
// Redis client; neither connects before a lab needs it.
func New(pool *pgxpool.Pool, cfg Config) (*Labs, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pc := pool.Config().Copy()
	pc.MaxConns = maxLabConns
	pc.MinConns = 0
	// Unqualified names are the lab's tables: the app's own code (the
	// idempotency store, the consumer rule) runs on them unchanged.
	pc.ConnConfig.RuntimeParams["search_path"] = "labs"
	lab, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("labs: pool: %w", err)
	}
	opts, err := redis.ParseURL(cmp.Or(cfg.RedisURL, "redis://127.0.0.1:6379/0"))
	if err != nil {
		lab.Close()
		return nil, fmt.Errorf("labs: REDIS_URL: %w", err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	if cfg.RedisPrefix == "" {
		cfg.RedisPrefix = "idemlab:labs:" + pool.Config().ConnConfig.Database + ":"
	}
	cfg.RedisServer = cmp.Or(cfg.RedisServer, "redis-server")
	return &Labs{pool: pool, lab: lab, redis: redis.NewClient(opts), cfg: cfg, systems: map[string]*fakeSystem{},
		failoverRun: make(chan struct{}, 1)}, nil
}

// Close stops the fake systems and closes the pool and the Redis client.
func (l *Labs) Close() {
	l.mu.Lock()
	for _, s := range l.systems {
		s.close()
	}
	l.systems = map[string]*fakeSystem{}
	l.mu.Unlock()
	l.redis.Close()
	l.lab.Close()
}

// Unavailable says why the lab called name cannot run here, as far as a
// look at this machine tells without running it (the failover lab's server
// binaries); "" when nothing is missing or the lab needs no such look.
func (l *Labs) Unavailable(name string) string {
	lab, ok := Find(name)
	if !ok || lab.check == nil {
		return ""
	}
	if err := lab.check(l.cfg); err != nil {
		return strings.TrimPrefix(err.Error(), "pgcluster: ")
	}
	return ""
}

// Errors a run or a lookup returns.
var (
	// ErrRunNotFound: no run with that id, of that lab, that the caller may see.
	ErrRunNotFound = errors.New("labs: run not found")
	// ErrUnavailable: the lab needs a part this process does not have.
	ErrUnavailable = errors.New("labs: the lab cannot run here")
)

// env is what a scenario gets: the labs' parts and its run's identity.
type env struct {
	*Labs
	run  int64
	user int64

	mu         sync.Mutex
	subjects   []int64  // subjects of the fake systems this run used
	redisKeys  []string // Redis keys this run wrote
	operations []int64  // the timeout lab's cancellations
}

// subject returns a new subject id for the fake systems: no other run, and
// no real policy, has it.
func (e *env) subject(ctx context.Context) (int64, error) {
	var id int64
	if err := e.lab.QueryRow(ctx, `SELECT nextval('labs.subject_ids')`).Scan(&id); err != nil {
		return 0, fmt.Errorf("labs: subject: %w", err)
	}
	e.mu.Lock()
	e.subjects = append(e.subjects, id)
	e.mu.Unlock()
	return id, nil
}

// redisKey names the Redis key of a name of this run (e.name), under the
// labs' prefix, and remembers it for cleanup.
func (e *env) redisKey(name string) string {
	k := e.cfg.RedisPrefix + name
	e.mu.Lock()
	if !slices.Contains(e.redisKeys, k) {
		e.redisKeys = append(e.redisKeys, k)
	}
	e.mu.Unlock()
	return k
}

// scratch lists every labs table a scenario writes with its run's id.
var scratch = []string{
	`DELETE FROM effects WHERE run_id = $1`,
	`DELETE FROM operations_without_unique WHERE run_id = $1`,
	`DELETE FROM operations WHERE run_id = $1`,
	`DELETE FROM claims_without_unique WHERE run_id = $1`,
	`DELETE FROM outbox WHERE run_id = $1`,
	`DELETE FROM published WHERE run_id = $1`,
	`DELETE FROM bookings_plain_unique WHERE run_id = $1`,
	`DELETE FROM bookings_partial_unique WHERE run_id = $1`,
	`DELETE FROM deposit_bookings WHERE run_id = $1`,
	`DELETE FROM callback_steps WHERE run_id = $1`,
	`DELETE FROM callback_inbox WHERE run_id = $1`,
	`DELETE FROM callback_effects WHERE run_id = $1`,
	// rows keyed by names that carry the run: "run 7 …"
	`DELETE FROM idempotency_keys WHERE idempotency_key LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM inbox WHERE consumer LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM event_deliveries WHERE consumer LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM consumer_effects WHERE consumer LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM external_systems WHERE name LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM histories WHERE key LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM history_events WHERE key LIKE 'run-' || $1::bigint || '-%'`,
	`DELETE FROM history_parked WHERE key LIKE 'run-' || $1::bigint || '-%'`,
}

// cleanup deletes what the run wrote: its scratch rows, its fake systems'
// records and faults, its Redis keys. Bounded and best effort: a failure
// is logged, the result stands.
func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	batch := &pgx.Batch{}
	for _, stmt := range scratch {
		batch.Queue(stmt, e.run)
	}
	e.mu.Lock()
	subjects, keys := e.subjects, e.redisKeys
	e.mu.Unlock()
	if len(subjects) > 0 {
		batch.Queue(`DELETE FROM fake_effects WHERE subject_id = ANY($1)`, subjects)
		batch.Queue(`DELETE FROM fake_requests WHERE subject_id = ANY($1)`, subjects)
		// The fault machinery's rows for this run's subjects: the lab's own
		// systems only ('labs…'), never the provider's or payments'.
		subjectNames := make([]string, len(subjects))
		for i, s := range subjects {
			subjectNames[i] = fmt.Sprintf("policy:%d", s)
		}
		batch.Queue(`DELETE FROM fault.script WHERE system LIKE 'labs%' AND subject = ANY($1)`, subjectNames)
		batch.Queue(`DELETE FROM fault.settings WHERE system LIKE 'labs%' AND subject = ANY($1)`, subjectNames)
		batch.Queue(`DELETE FROM fault.late_arrivals WHERE system LIKE 'labs%' AND subject = ANY($1)`, subjectNames)
	}
	if err := e.lab.SendBatch(ctx, batch).Close(); err != nil {
		e.cfg.Logger.Warn("labs: cleanup", "run", e.run, "err", err)
	}
	if len(keys) > 0 {
		if err := e.redis.Del(ctx, keys...).Err(); err != nil {
			e.cfg.Logger.Warn("labs: cleanup of Redis keys", "run", e.run, "err", err)
		}
	}
}

// name is a name that carries the run, for rows keyed by text: keys,
// consumers, systems ("run-7-broken").
func (e *env) name(parts ...string) string {
	return fmt.Sprintf("run-%d-%s", e.run, strings.Join(parts, "-"))
}

// TimeoutsDeps is what the timeout lab needs of the app: its cancellation
// workflow, and the provider's control API to schedule the faults.
type TimeoutsDeps struct {
	Canceller *policies.Canceller
	Provider  interface {
		SetFaults(ctx context.Context, f fault.Fault) (fault.Config, error)
	}
	// ProviderTimeout is how long the app waits for the provider
	// (PROVIDER_TIMEOUT): the slow call is made slower than that.
	ProviderTimeout time.Duration
}

type fakeSystem struct {
	fault.Service
	srv *http.Server
	url string
}

func (s *fakeSystem) close() {
	s.Service.Close() // releases every held request first
	s.srv.Close()
}
