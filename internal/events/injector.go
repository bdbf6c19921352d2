package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
)

// Mode is what the redelivery injector does to one delivery. Every mode
// makes some layer see an event again; none may make a consumer apply it
// twice.
type Mode string

const (
	// DeliverTwice: the event is handed to the transport twice. NATS drops
	// the copy inside its dedupe window and the task queue refuses the
	// copy's task name (the broker layer catches it); River runs the job
	// again and Kafka stores a second record (the inbox catches it).
	DeliverTwice Mode = "deliver_twice"
	// FailAfterCommit: the handler commits its effect, then reports failure
	// instead of acknowledging; the transport redelivers.
	FailAfterCommit Mode = "fail_after_commit"
	// LoseAck: the handler commits and its acknowledgement never arrives;
	// the transport redelivers after its ack deadline.
	LoseAck Mode = "lose_ack"
	// OutOfOrder: the delivery is sent back unhandled with a delay, so the
	// events behind it overtake it.
	OutOfOrder Mode = "out_of_order"
	// HoldPastDeadline: the handler sits on the delivery past its ack
	// deadline before handling it; the transport hands it to another
	// instance meanwhile, and both handle it.
	HoldPastDeadline Mode = "hold_past_deadline"
	// AfterWindow: the event is handed to the transport again after the
	// broker's dedupe window has passed: the broker accepts it as new, and
	// only the inbox stands between it and a second effect.
	AfterWindow Mode = "after_window"
)

// Modes lists every mode.
var Modes = []Mode{DeliverTwice, FailAfterCommit, LoseAck, OutOfOrder, HoldPastDeadline, AfterWindow}

// ErrUnknownMode names a mode that does not exist.
var ErrUnknownMode = errors.New("events: unknown injector mode")

// Injection is one entry of the injector's script.
type Injection struct {
	ID        int64     `json:"id"`
	Mode      Mode      `json:"mode"`
	Consumer  *string   `json:"consumer"` // nil: every consumer
	Remaining int       `json:"remaining"`
	CreatedAt time.Time `json:"created_at"`
}

// Injector is the redelivery injector: a script of "the next N deliveries
// get this mode", kept in the database (event_injections) so every replica
// follows the same script. Deterministic: entries are used in id order,
// each by exactly one delivery at a time.
type Injector struct {
	pool *pgxpool.Pool

	// A process asks the database only while something may be armed: after
	// a take found nothing, it trusts that for idleFor (Arm on this process
	// ends the wait at once; another replica's Arm is seen within idleFor).
	mu        sync.Mutex
	idleUntil time.Time
	// woken counts wake calls: a take trusts the "nothing" it saw only if
	// no arming committed while it looked (trustNothing).
	woken uint64
	// inArming, when set (tests only), runs inside Set's transaction after
	// the new entry is written and before the commit.
	inArming func()
}

const idleFor = 500 * time.Millisecond

// NewInjector returns the injector over pool's script.
func NewInjector(pool *pgxpool.Pool) *Injector { return &Injector{pool: pool} }

// ParseMode returns the mode named s.
func ParseMode(s string) (Mode, error) {
	if !slices.Contains(Modes, Mode(s)) {
		return "", fmt.Errorf("%w %q", ErrUnknownMode, s)
	}
	return Mode(s), nil
}

// Arm adds "the next n deliveries (to consumer, or any when empty) get
// mode" to the end of the script.
func (in *Injector) Arm(ctx context.Context, mode Mode, consumer string, n int) (Injection, error) {
	c, err := validInjection(mode, consumer, n)
	if err != nil {
		return Injection{}, err
	}
	inj, err := in.arm(ctx, in.pool, mode, c, n)
	if err == nil {
		in.wake()
	}
	return inj, err
}

// Set replaces the whole script with one entry: arming from the page or
// the API is a setting, so sending it twice leaves the same script.
func (in *Injector) Set(ctx context.Context, mode Mode, consumer string, n int) (Injection, error) {
	c, err := validInjection(mode, consumer, n)
	if err != nil {
		return Injection{}, err
	}
	var inj Injection
	err = pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM event_injections`); err != nil {
			return fmt.Errorf("events: set injector: %w", err)
		}
		var err error
		if inj, err = in.arm(ctx, tx, mode, c, n); err == nil && in.inArming != nil {
			in.inArming()
		}
		return err
	})
	if err == nil {
		in.wake()
	}
	return inj, err
}

// wake ends this process's "nothing armed" wait. It runs after the arming
// commits: woken before, a delivery that looks in between still sees
// nothing and would trust that for another idleFor, and the first
// deliveries after arming would go out uninjected.
func (in *Injector) wake() {
	in.mu.Lock()
	in.idleUntil = time.Time{}
	in.woken++
	in.mu.Unlock()
}

// trustNothing makes this process trust "nothing armed" for idleFor — unless
// an arming woke it since the look that saw nothing began (woken is no
// longer seen): that look may have read the script before the arming's
// commit, and trusting it would send the first deliveries out uninjected.
func (in *Injector) trustNothing(seen uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.woken == seen {
		in.idleUntil = time.Now().Add(idleFor)
	}
}

// validInjection checks an entry and returns its consumer as the column
// stores it (nil: every consumer).
func validInjection(mode Mode, consumer string, n int) (*string, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return nil, err
	}
	if consumer != "" && !slices.Contains(Consumers, consumer) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownConsumer, consumer)
	}
	if n < 1 || n > 1000 {
		return nil, fmt.Errorf("%w: count %d is not from 1 to 1000", ErrInvalidEvent, n)
	}
	if consumer == "" {
		return nil, nil
	}
	return &consumer, nil
}

func (in *Injector) arm(ctx context.Context, db database.DBTX, mode Mode, c *string, n int) (Injection, error) {
	rows, err := db.Query(ctx, `
		INSERT INTO event_injections (mode, consumer, remaining)
		VALUES ($1, $2, $3)
		RETURNING id, mode, consumer, remaining, created_at`, mode, c, n)
	if err != nil {
		return Injection{}, fmt.Errorf("events: arm injector: %w", err)
	}
	inj, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Injection])
	if err != nil {
		return Injection{}, fmt.Errorf("events: arm injector: %w", err)
	}
	return inj, nil
}

// Clear removes every entry.
func (in *Injector) Clear(ctx context.Context) error {
	if _, err := in.pool.Exec(ctx, `DELETE FROM event_injections`); err != nil {
		return fmt.Errorf("events: clear injector: %w", err)
	}
	return nil
}

// List returns the script, entries still to be used first.
func (in *Injector) List(ctx context.Context) ([]Injection, error) {
	rows, err := in.pool.Query(ctx, `
		SELECT id, mode, consumer, remaining, created_at
		  FROM event_injections
		 ORDER BY remaining = 0, id DESC
		 LIMIT 50`)
	if err != nil {
		return nil, fmt.Errorf("events: list injector: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Injection])
	if err != nil {
		return nil, fmt.Errorf("events: list injector: %w", err)
	}
	return list, nil
}

// quiet reports that nothing was armed when this process last looked (a
// nil injector is always quiet).
func (in *Injector) quiet() bool {
	if in == nil {
		return true
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return time.Now().Before(in.idleUntil)
}

// take uses one delivery of the first entry that matches consumer ("" for
// a publish, which matches entries for any consumer) and one of modes.
// It returns "" when nothing matches. A nil injector never injects.
func (in *Injector) take(ctx context.Context, consumer string, modes ...Mode) (Mode, error) {
	if in == nil {
		return "", nil
	}
	in.mu.Lock()
	idle, seen := time.Now().Before(in.idleUntil), in.woken
	in.mu.Unlock()
	if idle {
		return "", nil
	}
	var mode Mode
	err := in.pool.QueryRow(ctx, `
		UPDATE event_injections
		   SET remaining = remaining - 1
		 WHERE id = (SELECT id
		               FROM event_injections
		              WHERE remaining > 0
		                AND mode = ANY($2)
		                AND (consumer IS NULL OR consumer = $1 OR $1 = '')
		              ORDER BY id
		              LIMIT 1
		                FOR UPDATE) -- wait, not skip: the next delivery takes the next use, deterministically
		RETURNING mode`, consumer, modes).Scan(&mode)
	if errors.Is(err, pgx.ErrNoRows) {
		// Trust "nothing" for a while only when nothing at all is armed,
		// not merely nothing for this consumer or these modes.
		var armed bool
		if err := in.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM event_injections WHERE remaining > 0)`).Scan(&armed); err != nil {
			return "", fmt.Errorf("events: injector: %w", err)
		}
		if !armed {
			in.trustNothing(seen)
		}
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("events: injector: %w", err)
	}
	return mode, nil
}
