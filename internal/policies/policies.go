package policies

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Policy statuses.
const (
	StatusActive    = "ACTIVE"
	StatusCancelled = "CANCELLED"
)

// ErrNotFound is returned for an unknown policy and for another customer's
// policy alike, so ids never reveal what exists.
var ErrNotFound = errors.New("policies: not found")

// Policy is one insurance policy. Premium is kept as the exact decimal text
// PostgreSQL holds (money never passes through a float); the coverage
// dates are days (YYYY-MM-DD), the period the premium pays for.
type Policy struct {
	ID            int64     `json:"id"`
	UserID        int64     `json:"user_id"`
	Number        string    `json:"number"`
	Holder        string    `json:"holder"`
	Premium       string    `json:"premium"`
	Status        string    `json:"status"`
	CoverageStart string    `json:"coverage_start"`
	CoverageEnd   string    `json:"coverage_end"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Store reads policies, for the pages and the API. (The cancellation writes
// them, in its own steps: cancel.go.)
type Store struct {
	db database.DBTX
}

// NewStore returns a Store over db.
func NewStore(db database.DBTX) *Store { return &Store{db: db} }

const policyColumns = `id, user_id, number, holder, premium::text, status, coverage_start::text, coverage_end::text,
	created_at, updated_at`

// ListFilter narrows List. Status "" means any; AfterID is the cursor: only
// policies with a larger id are returned.
type ListFilter struct {
	UserID  int64
	Status  string
	AfterID int64
	Limit   int
}

// List returns the user's policies in id order, at most f.Limit of them.
func (s *Store) List(ctx context.Context, f ListFilter) ([]Policy, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+policyColumns+`
		  FROM policies
		 WHERE user_id = $1
		   AND ($2 = '' OR status = $2)
		   AND id > $3
		 ORDER BY id
		 LIMIT $4`, f.UserID, f.Status, f.AfterID, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("policies: list: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Policy])
	if err != nil {
		return nil, fmt.Errorf("policies: list: %w", err)
	}
	return list, nil
}

// Get returns the user's policy id, or ErrNotFound when it does not exist or
// belongs to someone else.
func (s *Store) Get(ctx context.Context, userID, id int64) (Policy, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+policyColumns+`
		  FROM policies
		 WHERE id = $1
		   AND user_id = $2 -- ownership is part of the lookup, not a check after it`, id, userID)
	if err != nil {
		return Policy{}, fmt.Errorf("policies: get: %w", err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Policy])
	if errors.Is(err, pgx.ErrNoRows) {
		return Policy{}, ErrNotFound
	}
	if err != nil {
		return Policy{}, fmt.Errorf("policies: get: %w", err)
	}
	return p, nil
}
