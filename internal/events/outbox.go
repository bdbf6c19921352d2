package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

var (
	// ErrEventNotFound: no outbox row has this id (never written, or
	// deleted after its retention).
	ErrEventNotFound = errors.New("events: event not found")
	// ErrNotDead: only a DEAD row can be replayed; this one is PENDING or
	// SENT (perhaps replayed already).
	ErrNotDead = errors.New("events: the event is not dead-lettered")
)

// Replay gives a DEAD row back to the relay: PENDING, attempts reset, due
// now. Replaying twice is harmless: the second finds the row PENDING (or
// SENT) and returns ErrNotDead, and a row published twice is deduped
// downstream anyway.
func Replay(ctx context.Context, db database.DBTX, id uuid.UUID) error {
	tag, err := db.Exec(ctx, `
		UPDATE outbox
		   SET status = 'PENDING',
		       attempts = 0,
		       next_attempt_at = now(),
		       claim_token = NULL
		 WHERE id = $1
		   AND status = 'DEAD' -- 0 rows: not dead (replayed already, or never was)`, id)
	if err != nil {
		return fmt.Errorf("events: replay %s: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var status string
	err = db.QueryRow(ctx, `SELECT status FROM outbox WHERE id = $1`, id).Scan(&status)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrEventNotFound
	}
	if err != nil {
		return fmt.Errorf("events: replay %s: %w", id, err)
	}
	return ErrNotDead
}
