package workflow

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/database"
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

// Types lists the registered operation types, for the recovery loop.
func (e *Engine) Types() []string {
	types := make([]string, 0, len(e.defs))
	for t := range e.defs {
		types = append(types, t)
	}
	return types
}

// Clock is the engine's database clock.
func (e *Engine) Clock() *database.Clock { return e.cfg.Clock }

// Owner identifies who is acting: a request or a recovery worker.
type Owner struct {
	// ID says who, for people: "request 3f2c… on app-1", "recovery on app-2".
	ID string
	// Lease is how long the owner may act before others may take over.
	Lease time.Duration
}

// StartFunc records a new operation's intent — its first step — in tx, as
// owner, and returns it: a new operation, or a FAILED one started again
// (next run) — with its run's steps when the start laid them out itself (a
// retry from a step: RetryFrom). Business refusals are returned wrapped in Refused. When the
// request that started an existing operation comes back (same request key:
// its first attempt died before answering), it returns that operation with
// existing true: nothing runs again, the answer is the operation as it is.
type StartFunc func(ctx context.Context, tx pgx.Tx, owner Owner) (op Operation, existing bool, err error)

// Start runs a new operation of type typ for a request:
//
//	tx 1:  hooks.Begin · start (the intent) · the local steps that follow ·
//	       the SENT of the first external step, with its deadline
//	       ── no transaction open ──
//	call:  the external step, under its step key
//	tx 2:  its outcome · the local steps that follow · the next SENT …
//	       … and hooks.Finish in the transaction where the request stops:
//	       the operation finished, refused, or handed to recovery
//
// A refusal of start (an error wrapped in Refused) goes to hooks.Finish in
// tx 1 and is returned, still wrapped, once committed. Any other error rolls its transaction back and is returned:
// ErrLeaseLost when recovery took the operation over meanwhile (the outcome
// is its to record), or a database failure.
func (e *Engine) Start(ctx context.Context, typ, actor string, start StartFunc, hooks Hooks[Operation]) (Operation, error) {
	def, ok := e.defs[typ]
	if !ok {
		return Operation{}, fmt.Errorf("workflow: no definition for %q", typ)
	}
	owner := Owner{ID: actor, Lease: e.cfg.Lease}
	var (
		r       *runner
		next    *pending
		refusal error
		result  Operation // the answer when the request stops in tx 1
	)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		r, next, refusal = nil, nil, nil // a retried transaction starts over
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err
		}
		op, existing, err := start(ctx, tx, owner)
		switch {
		case IsRefused(err):
			refusal = err
			return hooks.RunFinish(ctx, tx, Operation{}, err)
		case err != nil:
			return err
		case existing:
			if result, err = e.recordRetry(ctx, tx, op.ID, actor); err != nil {
				return err
			}
			return hooks.RunFinish(ctx, tx, result, nil)
		}
		r = e.runner(def, op, actor)
		if op.Steps == nil { // a retry from a step lays its run out itself (RetryFrom)
			if err := r.insertSteps(ctx, tx); err != nil {
				return err
			}
		}
		r.crash(ctx, crashAfter(def.Steps[0].Name))
		if next, err = r.advance(ctx, tx, true); err != nil {
			return err
		}
		if err := r.flush(ctx, tx); err != nil {
			return err
		}
		if next == nil {
			result = r.op
			return hooks.RunFinish(ctx, tx, r.op, nil)
		}
		return nil
	})
	switch {
	case err != nil:
		return Operation{}, r.fenced(ctx, err)
	case refusal != nil:
		return Operation{}, refusal
	case next == nil:
		r.crash(ctx, CrashAfterCommit)
		return result, nil
	}
	// From here on the work continues even if the client goes away: it will
	// retry with the same key and must find the work done or owned.
	op, err := r.drive(context.WithoutCancel(ctx), next, r.handOver, hooks)
	if err != nil {
		return Operation{}, err
	}
	r.crash(ctx, CrashAfterCommit)
	return op, nil
}

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

// recordRetry notes that the request which started opID came back with the
// same key, and returns the operation as it is. It changes nothing.
func (e *Engine) recordRetry(ctx context.Context, tx pgx.Tx, opID int64, actor string) (Operation, error) {
	op, err := e.operation(ctx, tx, opID)
	if err != nil {
		return Operation{}, err
	}
	return op, recordEvent(ctx, tx, event{op: op, from: op.Status, actor: actor,
		detail: "the request that started this operation was retried with the same key: answered with the operation as it is now"})
}
