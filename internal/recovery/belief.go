package recovery

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
var ErrUnknownSystem = errors.New("recovery: no such external system")

// Says states the belief for the timeline.
func (b Belief) Says() string {
	not := ""
	if !b.Idempotent {
		not = "NOT "
	}
	return fmt.Sprintf("the app believes %s calls are %sidempotent (set by %s at %s)",
		b.System, not, b.UpdatedBy, b.UpdatedAt.UTC().Format(time.RFC3339))
}

const beliefColumns = `name, believed_idempotent, updated_at, updated_by`

// ReadBelief reads the belief about system now, in db.
func ReadBelief(ctx context.Context, db database.DBTX, system string) (Belief, error) {
	rows, err := db.Query(ctx, `
		SELECT `+beliefColumns+`
		  FROM external_systems
		 WHERE name = $1`, system)
	if err != nil {
		return Belief{}, fmt.Errorf("recovery: belief about %s: %w", system, err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Belief])
	if errors.Is(err, pgx.ErrNoRows) {
		return Belief{}, fmt.Errorf("%w: %q", ErrUnknownSystem, system)
	}
	if err != nil {
		return Belief{}, fmt.Errorf("recovery: belief about %s: %w", system, err)
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
		return nil, fmt.Errorf("recovery: beliefs: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Belief])
	if err != nil {
		return nil, fmt.Errorf("recovery: beliefs: %w", err)
	}
	return list, nil
}

// SetBelief records what the app believes about system from now on: a
// person's word (PUT /api/v1/admin/systems/{name}, a fake's switch that
// flips the fake and the belief together). An instance's start seeds it
// with SeedBelief instead.
func SetBelief(ctx context.Context, db database.DBTX, system string, idempotent bool, by string) (Belief, error) {
	rows, err := db.Query(ctx, `
		UPDATE external_systems
		   SET believed_idempotent = $2,
		       updated_at = now(),
		       updated_by = $3
		 WHERE name = $1
		RETURNING `+beliefColumns, system, idempotent, by)
	if err != nil {
		return Belief{}, fmt.Errorf("recovery: set belief about %s: %w", system, err)
	}
	b, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Belief])
	if errors.Is(err, pgx.ErrNoRows) {
		return Belief{}, fmt.Errorf("%w: %q", ErrUnknownSystem, system)
	}
	if err != nil {
		return Belief{}, fmt.Errorf("recovery: set belief about %s: %w", system, err)
	}
	return b, nil
}

// startedBy is how SeedBelief signs the row: "PROVIDER_IDEMPOTENT_CALLS at
// the start of app-1". The seed recognises its own signature by it.
const startedBy = " at the start of "

// SeedBelief is an instance's start telling the app what its environment
// says about system (PROVIDER_IDEMPOTENT_CALLS, …). It is applied unless a
// person has said otherwise since the last start: the belief is one row
// for the whole fleet, and one replica restarting must not undo an
// operator's "not idempotent" for all of them — a chaos run found 23
// policies cancelled twice that way, each resent blind by a recovery that
// read the restarted instance's "idempotent". "Not idempotent" is applied
// always: the cautious word may come from anywhere. applied says which
// happened; the belief returned is the one now in force.
func SeedBelief(ctx context.Context, db database.DBTX, system string, idempotent bool, variable, instance string) (b Belief, applied bool, err error) {
	rows, err := db.Query(ctx, `
		WITH seeded AS (
		    UPDATE external_systems
		       SET believed_idempotent = $2,
		           updated_at = now(),
		           updated_by = $3
		     WHERE name = $1
		       AND (NOT $2 -- the cautious word, from anywhere
		            OR updated_by = 'default'
		            OR strpos(updated_by, $4) > 0) -- last set by a start, not by a person
		    RETURNING `+beliefColumns+`
		)
		SELECT `+beliefColumns+`, true FROM seeded
		UNION ALL
		SELECT `+beliefColumns+`, false FROM external_systems
		 WHERE name = $1 AND NOT EXISTS (SELECT FROM seeded)`,
		system, idempotent, variable+startedBy+instance, startedBy)
	if err != nil {
		return Belief{}, false, fmt.Errorf("recovery: seed belief about %s: %w", system, err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return Belief{}, false, fmt.Errorf("recovery: seed belief about %s: %w", system, err)
		}
		return Belief{}, false, fmt.Errorf("%w: %q", ErrUnknownSystem, system)
	}
	if err := rows.Scan(&b.System, &b.Idempotent, &b.UpdatedAt, &b.UpdatedBy, &applied); err != nil {
		return Belief{}, false, fmt.Errorf("recovery: seed belief about %s: %w", system, err)
	}
	rows.Close()
	return b, applied, rows.Err()
}
