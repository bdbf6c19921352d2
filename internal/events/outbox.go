package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/workflow"
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

// Replayed is the answer to a replay: the event, PENDING again.
type Replayed struct {
	ID     uuid.UUID `json:"id"`
	Status string    `json:"status"`
}

// ReplayDead is the replay workflow a person starts from the Events page:
// one transaction with the request's hooks (the key claim, the stored
// answer), so a double-click or a retried request replays once. A refusal
// (ErrNotDead, ErrEventNotFound) is passed to Finish, committed with the
// stored answer, and returned marked workflow.Refused.
func ReplayDead(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID, h workflow.Hooks[Replayed]) (Replayed, error) {
	r := Replayed{ID: id, Status: "PENDING"}
	var refusal error
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := h.RunBegin(ctx, tx); err != nil {
			return err
		}
		refusal = Replay(ctx, tx, id)
		if refusal != nil && !errors.Is(refusal, ErrNotDead) && !errors.Is(refusal, ErrEventNotFound) {
			return refusal
		}
		return h.RunFinish(ctx, tx, r, refusal)
	})
	if err != nil {
		return Replayed{}, err
	}
	if refusal != nil {
		return Replayed{}, workflow.Refused(refusal)
	}
	return r, nil
}
