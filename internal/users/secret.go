package users

import (
	"context"
	"crypto/rand"
	"fmt"
)

// ServerSecret returns the secret kept in the database under name (table
// server_secrets, 00095), making it on first use: 32 random bytes, the same
// for every replica and every restart after. It is what binds CSRF tokens
// to sessions when SESSION_SECRET is unset. Two processes starting at once
// both try to insert; the primary key keeps the first, and both read it.
func (s *Store) ServerSecret(ctx context.Context, name string) ([]byte, error) {
	fresh := make([]byte, 32)
	rand.Read(fresh)
	if _, err := s.db.Exec(ctx, `
		INSERT INTO server_secrets (name, value)
		VALUES ($1, $2)
		ON CONFLICT (name) DO NOTHING -- made already: keep it`, name, fresh); err != nil {
		return nil, fmt.Errorf("users: server secret: %w", err)
	}
	var secret []byte
	if err := s.db.QueryRow(ctx, `SELECT value FROM server_secrets WHERE name = $1`, name).Scan(&secret); err != nil {
		return nil, fmt.Errorf("users: server secret: %w", err)
	}
	return secret, nil
}
