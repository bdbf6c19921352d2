package labs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/workflow"
)

// A demo knob, not part of the pattern: end a live operation's lease now,
// so a reader watches recovery claim an operation whose owner went silent
// ("its owner's lease ran out") without waiting OPERATION_LEASE. The owner,
// if it is alive after all, keeps its token and is fenced at its next write:
// that is what a lease is for.

// ErrNoLiveLease: the operation is not live, or its lease has already ended.
var ErrNoLiveLease = errors.New("the operation is finished, waiting for a person, or already claimable: it has no running lease to end")

const sqlEndLease = `
UPDATE operations
   SET lease_expires_at = now(), -- as if the owner had stopped renewing it: claimable at the next pass
       updated_at = now()
 WHERE id = $1
   AND status IN ('IN_PROGRESS', 'RECOVERING')
   AND lease_expires_at > now() -- 0 rows: not live, or already claimable
RETURNING status, owner_token::text`

// EndLease ends operation id's lease now and writes why on its timeline,
// in one transaction. ErrNoLiveLease when there is no running lease to end.
func EndLease(ctx context.Context, pool *pgxpool.Pool, id int64, actor string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var status string
		var owner *string
		if err := tx.QueryRow(ctx, sqlEndLease, id).Scan(&status, &owner); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				var exists bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM operations WHERE id = $1)`, id).Scan(&exists); err != nil {
					return fmt.Errorf("labs: end lease: %w", err)
				}
				if !exists {
					return workflow.ErrNotFound
				}
				return ErrNoLiveLease
			}
			return fmt.Errorf("labs: end lease: %w", err)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO operation_timeline (operation_id, id, line_ids, from_status, to_status, actor, owner_token, detail,
			                                statement, step)
			SELECT $1, line, ARRAY[line], ARRAY[$2::text], ARRAY[$2::text], ARRAY[$3::text], ARRAY[$4::uuid], ARRAY[$5::text], ARRAY[$6::text],
			       ARRAY[NULL::text]
			  FROM nextval('operation_timeline_line_seq') AS line -- one line: the timeline's own id for it`,
			id, status, actor, owner,
			"lease ended now (demo control): from here its owner counts as silent, and recovery may claim the operation",
			sqlEndLease)
		if err != nil {
			return fmt.Errorf("labs: end lease: %w", err)
		}
		return nil
	})
}
