package demo

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/users"
)

// Dataset is the shape of a reset: how many generated users, how many
// policies each user (demo customers included) owns, and how many slots.
type Dataset struct {
	Users           int `json:"users"`
	PoliciesPerUser int `json:"policies_per_user"`
	Slots           int `json:"slots"`
	// DepositSlots are slots of DepositResource, each needing a deposit
	// (the deposit saga); 0 by default, so a reset for a load test of
	// plain bookings has none.
	DepositSlots int `json:"deposit_slots"`
}

// Limits keep a reset to seconds on a laptop.
const (
	MaxUsers           = 10000
	MaxPoliciesPerUser = 100
	MaxSlots           = 100000
)

// ErrInvalidDataset reports a dataset outside the limits; the error is a
// *DatasetError naming the field.
var ErrInvalidDataset = errors.New("demo: invalid dataset")

// DatasetError is one field of a Dataset out of its range.
type DatasetError struct {
	Field    string // the JSON name: users, policies_per_user or slots
	Min, Max int
}

func (e *DatasetError) Error() string {
	return fmt.Sprintf("demo: invalid dataset: %s must be %d to %d", e.Field, e.Min, e.Max)
}

func (e *DatasetError) Unwrap() error { return ErrInvalidDataset }

// Validate reports whether d is within the limits.
func (d Dataset) Validate() error {
	switch {
	case d.Users < 0 || d.Users > MaxUsers:
		return &DatasetError{"users", 0, MaxUsers}
	case d.PoliciesPerUser < 1 || d.PoliciesPerUser > MaxPoliciesPerUser:
		return &DatasetError{"policies_per_user", 1, MaxPoliciesPerUser}
	case d.Slots < 1 || d.Slots > MaxSlots:
		return &DatasetError{"slots", 1, MaxSlots}
	case d.DepositSlots < 0 || d.DepositSlots > MaxSlots:
		return &DatasetError{"deposit_slots", 0, MaxSlots}
	}
	return nil
}

// Reset wipes every business table — users (and their sessions), policies, operations and their
// timelines, idempotency keys, slots, bookings — and seeds d in one
// transaction, ids starting again at 1, so a load test starts from the same
// data every time. The demo accounts keep their tokens; generated users
// (user-00001 …) get the token tokenFor gives their name — a function of the
// name and a server secret, so the same reset twice leaves the same state
// and is idempotent by nature. It returns every account with its token.
// The fake provider's state is not touched here: it is another system,
// reset through its own API.
func Reset(ctx context.Context, pool *pgxpool.Pool, accounts []Account, d Dataset, today time.Time, tokenFor func(name string) string) ([]Account, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	all := append([]Account(nil), accounts...)
	for i := 1; i <= d.Users; i++ {
		name := fmt.Sprintf("user-%05d", i)
		all = append(all, Account{Name: name, Role: users.RoleCustomer, Token: tokenFor(name)})
	}
	// TRUNCATE takes its locks table by table, in the order it names them.
	// The tables the event consumers write come first, in the order a
	// consumer takes them (inbox, then its effect, then the users its foreign
	// keys point at), so a reset waits for a consumer's commit instead of
	// holding a table that consumer needs next. A request writing at that
	// moment can still deadlock with it; the database then aborts one of the
	// two, and the reset runs again after a short pause.
	var err error
	for attempt := 1; attempt <= 4; attempt++ {
		if err = reset(ctx, pool, all, d, today); !isDeadlock(err) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, err
	}
	return all, nil
}

func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// reset is Reset's one transaction.
func reset(ctx context.Context, pool *pgxpool.Pool, all []Account, d Dataset, today time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			TRUNCATE -- what the consumers made of the events, in the order a consumer writes it
			         inbox, event_deliveries, mailbox, ledger_entries, ledger_days,
			         histories, history_events, history_parked,
			         -- the events of the data wiped, and their aggregates' counters (ids restart)
			         outbox, outbox_sequences, event_publishes,
			         -- the redelivery injector's script: a reset leaves every test double at its default
			         event_injections,
			         sessions, audit_entries, reconciliation_decisions, webhook_inbox, operation_calls, operation_steps, operation_timeline, operations,
			         idempotency_keys, bookings, slots, policies, users,
			         -- the labs' results name the users who ran them
			         labs.runs
			RESTART IDENTITY`)
		if err != nil {
			return fmt.Errorf("demo: reset: %w", err)
		}
		names, roles, hashes := make([]string, len(all)), make([]string, len(all)), make([][]byte, len(all))
		for i, a := range all {
			names[i], roles[i], hashes[i] = a.Name, a.Role, users.HashToken(a.Token)
		}
		// One statement per table, however large the dataset.
		if _, err := tx.Exec(ctx, `
			INSERT INTO users (name, role, api_token_sha256)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, names, roles, hashes); err != nil {
			return fmt.Errorf("demo: reset users: %w", err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
			SELECT u.id,
			       format('POL-%s-%s', upper(u.name), lpad(i::text, 3, '0')),
			       initcap(u.name),
			       (120 + i * 37.5)::numeric(10,2),
			       $2::date - 45 * (1 + (i - 1) % 5), $2::date - 45 * (1 + (i - 1) % 5) + 365
			  FROM users u,
			       generate_series(1, $1) AS i
			 WHERE u.role = 'customer'
			 ORDER BY u.id, i`, d.PoliciesPerUser, today.UTC().Format(time.DateOnly)); err != nil {
			return fmt.Errorf("demo: reset policies: %w", err)
		}
		// Seed's shape, from tomorrow: each resource's hours from 09:00, day
		// after day, as many as the dataset asks for — every slot in the
		// future, so every one can be booked.
		if _, err := tx.Exec(ctx, `
			INSERT INTO slots (resource, starts_at, ends_at)
			SELECT ($1::text[])[1 + i % n],
			       $2::timestamptz + make_interval(days => i / (n * $4::int), hours => $5::int + (i / n) % $4::int),
			       $2::timestamptz + make_interval(days => i / (n * $4::int), hours => $5::int + (i / n) % $4::int + 1)
			  FROM generate_series(0, $3 - 1) AS i,
			       cardinality($1::text[]) AS n
			 ORDER BY i`, Resources, tomorrow(today), d.Slots, SlotHours, SlotFirstHour); err != nil {
			return fmt.Errorf("demo: reset slots: %w", err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO slots (resource, starts_at, ends_at, deposit_cents)
			SELECT $1,
			       $2::timestamptz + make_interval(days => i / $5::int, hours => $6::int + i % $5::int),
			       $2::timestamptz + make_interval(days => i / $5::int, hours => $6::int + i % $5::int + 1),
			       $4
			  FROM generate_series(0, $3 - 1) AS i
			 ORDER BY i`, DepositResource, tomorrow(today), d.DepositSlots, DepositCents, SlotHours, SlotFirstHour); err != nil {
			return fmt.Errorf("demo: reset deposit slots: %w", err)
		}
		return nil
	})
}

// TokenFor returns the token a generated user gets: "load-" and 24 hex
// digits of HMAC-SHA256(secret, name). Stable across resets of one
// deployment, unguessable without its secret.
func TokenFor(secret []byte) func(name string) string {
	return func(name string) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(name))
		return "load-" + hex.EncodeToString(m.Sum(nil))[:24]
	}
}
