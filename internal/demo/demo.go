// Package demo seeds the data a newcomer needs to click through idemlab:
// three customers and an admin with known API tokens, twenty policies
// each, and a week of bookable slots.
//
// Seeding is idempotent (every insert is ON CONFLICT DO NOTHING on a natural
// key), so every replica runs it at every start and the result is the same as
// running it once.
package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/users"
)

// Account is a demo user and its API token.
type Account struct {
	Name  string
	Role  string
	Token string
}

// DefaultAccounts are the demo users listed in the README.
func DefaultAccounts() []Account {
	return []Account{
		{Name: "alice", Role: users.RoleCustomer, Token: "demo-alice"},
		{Name: "bob", Role: users.RoleCustomer, Token: "demo-bob"},
		{Name: "carol", Role: users.RoleCustomer, Token: "demo-carol"},
		{Name: "admin", Role: users.RoleAdmin, Token: "demo-admin"},
	}
}

// ParseTokens applies DEMO_TOKENS ("alice=tok1,admin=tok2") to the default
// accounts. Unknown names and malformed pairs are errors, so a typo in the
// environment is not silently ignored.
func ParseTokens(spec string) ([]Account, error) {
	accounts := DefaultAccounts()
	if strings.TrimSpace(spec) == "" {
		return accounts, nil
	}
	for _, pair := range strings.Split(spec, ",") {
		name, token, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || name == "" || len(token) < 8 {
			return nil, fmt.Errorf("demo: DEMO_TOKENS entry %q: want name=token with a token of at least 8 characters", pair)
		}
		found := false
		for i := range accounts {
			if accounts[i].Name == name {
				accounts[i].Token, found = token, true
			}
		}
		if !found {
			return nil, fmt.Errorf("demo: DEMO_TOKENS names unknown user %q", name)
		}
	}
	return accounts, nil
}

// Resources are the things slots book.
var Resources = []string{"Consulting room 1", "Consulting room 2", "Video call"}

// DepositResource is the resource whose slots need a deposit, charged at the
// payments service before the booking is confirmed (the deposit saga,
// internal/slots/deposit.go), and DepositCents that deposit.
const (
	DepositResource = "Recording studio"
	DepositCents    = 2500
)

// PoliciesPerCustomer is how many policies each demo customer owns: sixty
// in all, so a walk-through that cancels a few under every fault does not
// run out.
const PoliciesPerCustomer = 20

// SlotDays, SlotFirstHour and SlotHours shape the seeded week: hourly slots
// from 09:00 to 17:00 UTC on the seven days from tomorrow, for each
// resource — all in the future, so every seeded slot can be booked.
const (
	SlotDays      = 7
	SlotFirstHour = 9
	SlotHours     = 8
)

// SeededSlots is how many slots Seed (and the default reset) creates.
var SeededSlots = SlotDays * SlotHours * len(Resources)

// DefaultDataset is the reset's default: the demo accounts and nobody else,
// their policies, a week of slots and a week of deposit slots — what Seed
// gives a new database.
func DefaultDataset() Dataset {
	return Dataset{Users: 0, PoliciesPerUser: PoliciesPerCustomer, Slots: SeededSlots, DepositSlots: SlotDays * SlotHours}
}

// Seed creates the accounts (updating their tokens), their policies, and —
// when no slot lies in the future (a new database, or one a week old) — the
// week of slots SlotDays describes.
func Seed(ctx context.Context, pool *pgxpool.Pool, accounts []Account, today time.Time) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, a := range accounts {
			var userID int64
			// A changed DEMO_TOKENS takes effect at the next start.
			err := tx.QueryRow(ctx, `
				INSERT INTO users (name, role, api_token_sha256)
				VALUES ($1, $2, $3)
				ON CONFLICT (name) DO UPDATE
				   SET api_token_sha256 = excluded.api_token_sha256
				RETURNING id`, a.Name, a.Role, users.HashToken(a.Token)).Scan(&userID)
			if err != nil {
				return fmt.Errorf("demo: seed user %s: %w", a.Name, err)
			}
			if a.Role != users.RoleCustomer {
				continue
			}
			if err := seedPolicies(ctx, tx, userID, a.Name, PoliciesPerCustomer, today); err != nil {
				return err
			}
		}
		if err := seedSlots(ctx, tx, today); err != nil {
			return err
		}
		return seedDepositSlots(ctx, tx, today)
	})
}

func seedPolicies(ctx context.Context, tx pgx.Tx, userID int64, name string, n int, today time.Time) error {
	holder := strings.ToUpper(name[:1]) + name[1:]
	_, err := tx.Exec(ctx, `
		INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
		SELECT $1,
		       format('POL-%s-%s', upper($2), lpad(i::text, 3, '0')),
		       $3,
		       (120 + i * 37.5)::numeric(10,2),
		       -- a year's cover each, begun 45, 90, … 360 days ago and round
		       -- again: every policy is still covered, so every cancellation
		       -- refunds something, each a different share of its premium
		       $5::date - 45 * (1 + (i - 1) % 8),
		       $5::date - 45 * (1 + (i - 1) % 8) + 365
		  FROM generate_series(1, $4) AS i
		ON CONFLICT (number) DO NOTHING -- seeding twice changes nothing`,
		userID, name, holder, n, today.UTC().Format(time.DateOnly))
	if err != nil {
		return fmt.Errorf("demo: seed policies of %s: %w", name, err)
	}
	return nil
}

func seedSlots(ctx context.Context, tx pgx.Tx, today time.Time) error {
	var any bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM slots WHERE starts_at > $1 AND resource = ANY($2))`, today, Resources).Scan(&any); err != nil {
		return fmt.Errorf("demo: seed slots: %w", err)
	}
	if any {
		return nil
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO slots (resource, starts_at, ends_at)
		SELECT r.resource,
		       $2::timestamptz + make_interval(days => d, hours => h),
		       $2::timestamptz + make_interval(days => d, hours => h + 1)
		  FROM generate_series(0, $3::int - 1) AS d,
		       generate_series($4::int, $4::int + $5::int - 1) AS h,
		       unnest($1::text[]) WITH ORDINALITY AS r(resource, ord)
		 ORDER BY d, h, r.ord
		ON CONFLICT (resource, starts_at) DO NOTHING -- replicas seeding at once insert once`,
		Resources, tomorrow(today), SlotDays, SlotFirstHour, SlotHours)
	if err != nil {
		return fmt.Errorf("demo: seed slots: %w", err)
	}
	return nil
}

// seedDepositSlots adds the deposit resource's week of slots, from
// tomorrow, when none lies in the future (a database seeded before the
// deposit saga gets them too).
func seedDepositSlots(ctx context.Context, tx pgx.Tx, today time.Time) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO slots (resource, starts_at, ends_at, deposit_cents)
		SELECT $1,
		       $2::timestamptz + make_interval(days => d, hours => h),
		       $2::timestamptz + make_interval(days => d, hours => h + 1),
		       $3
		  FROM generate_series(0, 6) AS d,
		       generate_series(9, 16) AS h
		 WHERE NOT EXISTS (SELECT 1 FROM slots WHERE resource = $1 AND starts_at > now()) -- a week at a time
		 ORDER BY d, h
		ON CONFLICT (resource, starts_at) DO NOTHING -- replicas seeding at once insert once`,
		DepositResource, tomorrow(today), DepositCents)
	if err != nil {
		return fmt.Errorf("demo: seed deposit slots: %w", err)
	}
	return nil
}

// tomorrow is midnight UTC at the start of the day after today's.
func tomorrow(today time.Time) time.Time {
	t := today.UTC()
	return time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
}

// AccountsWithDefaultTokens names the accounts whose API token is still one
// of DefaultAccounts' — public knowledge, fit for a demo only.
func AccountsWithDefaultTokens(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	var hashes [][]byte
	for _, a := range DefaultAccounts() {
		hashes = append(hashes, users.HashToken(a.Token))
	}
	rows, err := pool.Query(ctx, `
		SELECT name
		  FROM users
		 WHERE api_token_sha256 = ANY($1)
		 ORDER BY name`, hashes)
	if err != nil {
		return nil, fmt.Errorf("demo: check tokens: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("demo: check tokens: %w", err)
	}
	return names, nil
}
