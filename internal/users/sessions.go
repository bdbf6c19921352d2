package users

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"
)

// Sessions are the browser's proof of "signed in as", kept in the sessions
// table so that they can be ended on the server: signing out deletes the
// row, and every replica stops accepting the cookie at once. A stateless
// signed cookie could not be revoked before it expired; a per-user
// generation could, but only all of a user's browsers together. A table
// costs the same one indexed read per request as looking the user up by id,
// which a signed cookie needed anyway.

// Session is a signed-in browser. ID goes into the cookie and nowhere else:
// the table holds only its hash.
type Session struct {
	ID      string
	User    User
	Expires time.Time
}

// sessionIDBytes is how much randomness a session id carries: 256 bits,
// beyond guessing however many requests an attacker sends.
const sessionIDBytes = 32

// StartSession signs u in for ttl under a new random id. It also removes
// u's expired sessions, so the table grows only with live ones.
func (s *Store) StartSession(ctx context.Context, u User, ttl time.Duration) (Session, error) {
	raw := make([]byte, sessionIDBytes)
	rand.Read(raw)
	id := base64.RawURLEncoding.EncodeToString(raw)
	var expires time.Time
	err := s.db.QueryRow(ctx, `
		WITH swept AS (
		    DELETE FROM sessions
		     WHERE user_id = $2
		       AND expires_at <= now() -- this user's dead sessions
		)
		INSERT INTO sessions (id_sha256, user_id, expires_at)
		VALUES ($1, $2, now() + make_interval(secs => $3))
		RETURNING expires_at`, HashToken(id), u.ID, ttl.Seconds()).Scan(&expires)
	if err != nil {
		return Session{}, fmt.Errorf("users: start session: %w", err)
	}
	return Session{ID: id, User: u, Expires: expires}, nil
}

// BySession returns the user signed in under session id, or ErrNotFound
// when there is no such session or it has expired.
func (s *Store) BySession(ctx context.Context, id string) (User, error) {
	if !validSessionID(id) {
		return User{}, ErrNotFound // not one of ours: no query
	}
	return s.one(ctx, `
		SELECT u.id, u.name, u.role
		  FROM sessions s
		  JOIN users u
		    ON u.id = s.user_id
		 WHERE s.id_sha256 = $1
		   AND s.expires_at > now() -- the database clock decides expiry`, HashToken(id))
}

// EndSession deletes session id. Ending a session that is already gone is
// not an error: signing out twice signs out once.
func (s *Store) EndSession(ctx context.Context, id string) error {
	if !validSessionID(id) {
		return nil
	}
	_, err := s.db.Exec(ctx, `
		DELETE FROM sessions
		 WHERE id_sha256 = $1`, HashToken(id))
	if err != nil {
		return fmt.Errorf("users: end session: %w", err)
	}
	return nil
}

// validSessionID reports whether id has the shape StartSession gives ids:
// 43 characters of unpadded base64url. A cookie of any other shape is not a
// session and costs no query.
func validSessionID(id string) bool {
	if len(id) != base64.RawURLEncoding.EncodedLen(sessionIDBytes) {
		return false
	}
	// Decoding alone would accept ids with line breaks in them (base64
	// skips \r and \n): only the exact encoding of 32 bytes is an id.
	b, err := base64.RawURLEncoding.DecodeString(id)
	return err == nil && len(b) == sessionIDBytes && base64.RawURLEncoding.EncodeToString(b) == id
}
