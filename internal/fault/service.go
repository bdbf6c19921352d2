package fault

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options tune a fake. The zero value is ready to use.
type Options struct {
	// HoldCap bounds how long a request the fake never answers (drop,
	// lost_response, a slow call, a dropped status query) stays open when its
	// caller does not give up. Default 2 minutes.
	HoldCap time.Duration
	// Logger receives the fake's own failures (database errors). Default
	// slog.Default().
	Logger *slog.Logger
	// Control says who may use the control API (faults, ledger, reset).
	// The zero value admits loopback callers only.
	Control Access
}

// Service is what every fake is built on: its pool, its fault store, the
// steps its calls go through, and its control API. A fake embeds it and adds
// its own business routes, state and ledger.
type Service struct {
	Pool    *pgxpool.Pool
	Store   *Store
	Calls   Calls
	Log     *slog.Logger
	Control Access
	// forget lists the statements that wipe the fake's own state on reset.
	forget []string
}

// NewService returns the base of the fake system, whose faults may be
// scoped to the subject kinds given, and whose reset runs the statements in
// forget (DELETE FROM its own tables) before restoring the default faults.
func NewService(pool *pgxpool.Pool, system string, kinds []string, forget []string, opts Options) Service {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	store := NewStore(pool, system, kinds...)
	return Service{
		Pool:    pool,
		Store:   store,
		Calls:   Calls{Store: store, Holder: NewHolder(opts.HoldCap), Log: opts.Logger},
		Log:     opts.Logger,
		Control: opts.Control,
		forget:  forget,
	}
}

// Close releases every request the fake is holding, and any it would hold
// from now on: each connection is aborted without an answer, as a crashing
// server would leave it. Call it before shutting the HTTP server down,
// whose graceful Shutdown would otherwise wait for held requests. Close is
// idempotent.
func (s Service) Close() { s.Calls.Holder.Close() }

// Register adds the control API to mux — GET and PUT /v1/faults, POST
// /v1/reset, and the fake's ledger at ledgerPath — each behind s.Control.
func (s Service) Register(mux *http.ServeMux, ledgerPath string, ledger http.HandlerFunc) {
	mux.HandleFunc("GET "+ledgerPath, s.Control.Guard(ledger))
	ControlAPI{Store: s.Store, Reset: s.Reset, Log: s.Log}.Register(mux, s.Control)
}

// Faults returns the whole fault configuration.
func (s Service) Faults(ctx context.Context) (Config, error) { return s.Store.Config(ctx) }

// SetFaults applies one fault setting and returns the resulting
// configuration (Store.Set). An invalid fault returns an *InvalidError
// naming the field and changes nothing.
func (s Service) SetFaults(ctx context.Context, f Fault) (Config, error) { return s.Store.Set(ctx, f) }

// Reset forgets the fake's own state, empties the script, drops the
// overrides, forgets the late arrivals and restores Default, in one
// transaction.
func (s Service) Reset(ctx context.Context) error {
	err := pgx.BeginTxFunc(ctx, s.Pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		for _, stmt := range s.forget {
			batch.Queue(stmt)
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		return s.Store.Reset(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("fault: %s reset: %w", s.Store.system, err)
	}
	return nil
}
