package workflow

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
)

// Engine runs workflows of steps: for the requests that start them, for the
// recovery loop that finishes what a crash or an unknown outcome left
// behind (it is the loop's Claimer and Recoverer), and for the person who
// decides what recovery could not. Every definition is run by the same code.
type Engine struct {
	pool    *pgxpool.Pool
	cfg     Config
	defs    map[string]*Definition
	metrics *metrics
}

// Config is what an Engine needs besides its pool.
type Config struct {
	// Lease is how long a request owns the operation it starts before
	// recovery may take over (OPERATION_LEASE). Each SENT renews it.
	Lease time.Duration
	// Clock is the database clock every lease comparison reads; tests move
	// it. Nil: the database's now().
	Clock *database.Clock
	// Crash is the process's crash switch (nil: never fires).
	Crash *crash.Switch
	// Registerer receives the engine's metrics (nil: kept, not exported).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// NewEngine returns an engine on pool. Register definitions before use.
func NewEngine(pool *pgxpool.Pool, cfg Config) *Engine {
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = &database.Clock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Engine{pool: pool, cfg: cfg, defs: map[string]*Definition{}, metrics: newMetrics(cfg.Registerer)}
}

// Register adds a workflow definition. It panics on a malformed one: that
// is a programming error, found at start.
func (e *Engine) Register(def Definition) {
	if err := def.validate(); err != nil {
		panic(err)
	}
	if _, dup := e.defs[def.Type]; dup {
		panic(fmt.Sprintf("workflow: %s registered twice", def.Type))
	}
	e.defs[def.Type] = &def
}

// Types lists the registered operation types, sorted (a page's filter
// lists them in this order: fourth read, they came in a map's order, new
// on every load).
func (e *Engine) Types() []string {
	return slices.Sorted(maps.Keys(e.defs))
}

// Clock is the engine's database clock.
func (e *Engine) Clock() *database.Clock { return e.cfg.Clock }

// runner is one owner driving one operation: the request that started it,
// or the recovery worker that claimed it. It keeps the operation as last
// written and the owner token every write is fenced by.
type runner struct {
	e     *Engine
	def   *Definition
	op    Operation
	token string
	actor string
	// branch names the recovery decision behind the writes ("" for a
	// request), for the timeline.
	branch string
	// asked holds status queries made since the last write; the next write
	// appends them to operation_calls in its transaction.
	asked []asked
	// events are the timeline lines noted in the transaction under way.
	events []event
}

func (e *Engine) runner(def *Definition, op Operation, actor string) *runner {
	return &runner{e: e, def: def, op: op, token: database.Deref(op.OwnerToken), actor: actor}
}

// asked is one status query, kept until the next write records it.
type asked struct {
	key, system string
	truth       external.Truth
	err         error
	took        time.Duration
}

// event is one line of an operation's timeline.
type event struct {
	op                                Operation
	from, actor, branch, step, detail string
	statement                         string // its name (statements.go), "" for none
}
