// Package users holds idemlab's accounts: the demo customers and the admin,
// and how a bearer token or a session becomes a User.
package users

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Roles a user can have. Admins may change the fake provider, resolve
// reconciliation and reset data; customers act on their own policies only.
const (
	RoleCustomer = "customer"
	RoleAdmin    = "admin"
)

// ErrNotFound is returned when no user matches a token, id or name.
var ErrNotFound = errors.New("users: not found")

// User is an account. The API token itself is never stored, only its hash.
type User struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	Role string `json:"role"`
}

// IsAdmin reports whether u may use admin-only routes.
func (u User) IsAdmin() bool { return u.Role == RoleAdmin }

// HashToken is how tokens are stored and looked up: a stolen table dump
// yields no usable tokens. SHA-256 (not a slow KDF) is right for long
// random tokens, which cannot be guessed from their hash.
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// Store reads users.
type Store struct {
	db database.DBTX
	// passwordCost is bcrypt's work factor for the passwords this store
	// sets, and for the comparison an unknown name costs (dummyHash).
	passwordCost int
	dummyHash    func() []byte
}

// NewStore returns a Store over db that hashes passwords at PasswordCost.
func NewStore(db database.DBTX) *Store { return (&Store{db: db}).WithPasswordCost(PasswordCost) }

// ByToken returns the user holding token, or ErrNotFound.
func (s *Store) ByToken(ctx context.Context, token string) (User, error) {
	return s.one(ctx, `
		SELECT id, name, role
		  FROM users
		 WHERE api_token_sha256 = $1`, HashToken(token))
}

// ByName returns the user called name, or ErrNotFound.
func (s *Store) ByName(ctx context.Context, name string) (User, error) {
	return s.one(ctx, `
		SELECT id, name, role
		  FROM users
		 WHERE name = $1`, name)
}

// List returns every user, customers first then admins, by name.
func (s *Store) List(ctx context.Context) ([]User, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, name, role
		  FROM users
		 ORDER BY role = 'admin', name`)
	if err != nil {
		return nil, fmt.Errorf("users: list: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[User])
	if err != nil {
		return nil, fmt.Errorf("users: list: %w", err)
	}
	return list, nil
}

func (s *Store) one(ctx context.Context, sql string, args ...any) (User, error) {
	var u User
	err := s.db.QueryRow(ctx, sql, args...).Scan(&u.ID, &u.Name, &u.Role)
	if isNoRows(err) {
		return User{}, ErrNotFound
	}
	if err != nil {
		return User{}, fmt.Errorf("users: %w", err)
	}
	return u, nil
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
