package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Belief is what the app believes about one external system: whether a
// repeated call with the same key applies nothing new. It cannot be learned
// by experiment — trying is exactly the double effect — so it is a setting,
// one per system (table external_systems), read by each recovery decision
// that depends on it, and named on the timeline when it was decisive.
type Belief struct {
	System     string    `json:"name"`
	Idempotent bool      `json:"believed_idempotent"`
	UpdatedAt  time.Time `json:"updated_at"`
	UpdatedBy  string    `json:"updated_by"`
}

// ErrUnknownSystem: no external system by that name.
var ErrUnknownSystem = errors.New("workflow: no such external system")

// says states the belief for the timeline.
func (b Belief) says() string {
	not := ""
	if !b.Idempotent {
		not = "NOT "
	}
	return fmt.Sprintf("the app believes %s calls are %sidempotent (set by %s at %s)",
		b.System, not, b.UpdatedBy, b.UpdatedAt.UTC().Format(time.RFC3339))
}

const beliefColumns = `name, believed_idempotent, updated_at, updated_by`

// Belief reads the belief about system now.
func (e *Engine) Belief(ctx context.Context, system string) (Belief, error) {
	rows, err := e.pool.Query(ctx, `
		SELECT `+beliefColumns+`
		  FROM external_systems
		 WHERE name = $1`, system)
	if err != nil {
		return Belief{}, fmt.Errorf("workflow: belief about %s: %w", system, err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Belief])
	if errors.Is(err, pgx.ErrNoRows) {
		return Belief{}, fmt.Errorf("%w: %q", ErrUnknownSystem, system)
	}
	if err != nil {
		return Belief{}, fmt.Errorf("workflow: belief about %s: %w", system, err)
	}
	return b, nil
}

// Beliefs lists what the app believes about every external system.
func Beliefs(ctx context.Context, db database.DBTX) ([]Belief, error) {
	rows, err := db.Query(ctx, `
		SELECT `+beliefColumns+`
		  FROM external_systems
		 ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("workflow: beliefs: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Belief])
	if err != nil {
		return nil, fmt.Errorf("workflow: beliefs: %w", err)
	}
	return list, nil
}

// SetBelief records what the app believes about system from now on: at
// start from PROVIDER_IDEMPOTENT_CALLS / PAYMENTS_IDEMPOTENT_CALLS, and
// when a person flips a fake's switch (the fake and the belief together).
func SetBelief(ctx context.Context, db database.DBTX, system string, idempotent bool, by string) (Belief, error) {
	rows, err := db.Query(ctx, `
		UPDATE external_systems
		   SET believed_idempotent = $2,
		       updated_at = now(),
		       updated_by = $3
		 WHERE name = $1
		RETURNING `+beliefColumns, system, idempotent, by)
	if err != nil {
		return Belief{}, fmt.Errorf("workflow: set belief about %s: %w", system, err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Belief])
	if errors.Is(err, pgx.ErrNoRows) {
		return Belief{}, fmt.Errorf("%w: %q", ErrUnknownSystem, system)
	}
	if err != nil {
		return Belief{}, fmt.Errorf("workflow: set belief about %s: %w", system, err)
	}
	return b, nil
}
