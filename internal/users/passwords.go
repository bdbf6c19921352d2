package users

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"sync"

	"golang.org/x/crypto/bcrypt"
)

// Outside demo mode a person signs in with a name and a password. The
// password is stored as a bcrypt hash: a slow, salted KDF, so a copy of the
// users table does not give the passwords back at any useful speed.
// (API tokens are long and random, so a fast SHA-256 is right for them;
// passwords are chosen by people, so they get the slow one.)

// PasswordCost is bcrypt's work factor: 2^12 rounds, about a quarter of a
// second per check on this project's two-core machine — nothing for a
// person signing in, a wall for someone guessing (and sign-in is rate
// limited as well).
const PasswordCost = 12

// WithPasswordCost returns a copy of s that hashes passwords at cost
// (PASSWORD_COST; 0 means PasswordCost). Only tests go lower: under the
// race detector one hash at cost 12 is seconds of CPU, and a password set
// at cost 4 proves the same. A hash is checked at the cost it was made
// with, so lowering the cost weakens only the passwords set afterwards.
func (s *Store) WithPasswordCost(cost int) *Store {
	cost = cmp.Or(cost, PasswordCost)
	return &Store{db: s.db, passwordCost: cost, dummyHash: sync.OnceValue(func() []byte {
		// a hash of nothing anyone types, compared against when the name is
		// unknown, so that the answer takes as long as for a known one
		h, err := bcrypt.GenerateFromPassword([]byte(rand.Text()), cost)
		if err != nil {
			panic(err)
		}
		return h
	})}
}

// Password length bounds. bcrypt reads at most 72 bytes, so a longer
// password would be silently cut; it is refused instead.
const (
	MinPasswordLength = 10
	MaxPasswordLength = 72
)

// ErrBadPassword is a password outside the length bounds.
var ErrBadPassword = fmt.Errorf("users: a password must be %d to %d bytes", MinPasswordLength, MaxPasswordLength)

// ErrWrongPassword is a failed sign-in: no such user, no password set, or
// the wrong one — deliberately one error, so an answer never says which
// names exist.
var ErrWrongPassword = errors.New("users: wrong name or password")

// ErrBadName is a user name that is not 1 to 64 of a-z, 0-9, '.', '_', '-'.
var ErrBadName = errors.New("users: a name is 1 to 64 characters of a-z, 0-9, '.', '_' and '-'")

var nameRule = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// ValidName reports whether name may name an account.
func ValidName(name string) bool { return nameRule.MatchString(name) }

// ByPassword returns the user called name if password is theirs, or
// ErrWrongPassword. An unknown name costs the same bcrypt comparison as a
// known one, so timing does not tell names apart either.
func (s *Store) ByPassword(ctx context.Context, name, password string) (User, error) {
	var u User
	var hash *string
	err := s.db.QueryRow(ctx, `
		SELECT id, name, role, password_bcrypt
		  FROM users
		 WHERE name = $1`, name).Scan(&u.ID, &u.Name, &u.Role, &hash)
	if err != nil && !isNoRows(err) {
		return User{}, fmt.Errorf("users: sign in: %w", err)
	}
	if hash == nil {
		bcrypt.CompareHashAndPassword(s.dummyHash(), []byte(password))
		return User{}, ErrWrongPassword
	}
	if bcrypt.CompareHashAndPassword([]byte(*hash), []byte(password)) != nil {
		return User{}, ErrWrongPassword
	}
	return u, nil
}

// SetPassword gives the user called name a new password.
func (s *Store) SetPassword(ctx context.Context, name, password string) error {
	if len(password) < MinPasswordLength || len(password) > MaxPasswordLength {
		return ErrBadPassword
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), s.passwordCost)
	if err != nil {
		return fmt.Errorf("users: set password: %w", err)
	}
	tag, err := s.db.Exec(ctx, `
		UPDATE users
		   SET password_bcrypt = $2
		 WHERE name = $1`, name, string(hash))
	if err != nil {
		return fmt.Errorf("users: set password: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// Put creates the account name with role, or changes the role of the one
// that exists. A new account gets an API token no one knows (NewToken
// issues a usable one) and no password (SetPassword sets one).
func (s *Store) Put(ctx context.Context, name, role string) (User, error) {
	if !ValidName(name) {
		return User{}, ErrBadName
	}
	if role != RoleCustomer && role != RoleAdmin {
		return User{}, fmt.Errorf("users: role %q is neither %s nor %s", role, RoleCustomer, RoleAdmin)
	}
	return s.one(ctx, `
		INSERT INTO users (name, role, api_token_sha256)
		VALUES ($1, $2, sha256(gen_random_uuid()::text::bytea)) -- a token no one knows
		ON CONFLICT (name) DO UPDATE
		   SET role = excluded.role
		RETURNING id, name, role`, name, role)
}

// NewToken replaces the API token of the user called name with a fresh
// random one and returns it: shown once, stored only as its hash.
func (s *Store) NewToken(ctx context.Context, name string) (string, error) {
	token := "tok-" + rand.Text()
	tag, err := s.db.Exec(ctx, `
		UPDATE users
		   SET api_token_sha256 = $2
		 WHERE name = $1`, name, HashToken(token))
	if err != nil {
		return "", fmt.Errorf("users: new token: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return "", ErrNotFound
	}
	return token, nil
}
