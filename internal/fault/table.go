package fault

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Table is one of a fake's tables of key records (fake_provider.requests,
// fake_payments.charges, fake_payments.refunds). Every fake shapes them
// alike — idempotency_key (the primary key), outcome ACCEPTED|REJECTED,
// reject_reason, completes_at, attempts, last_received_at — so the two
// statements that only touch those columns are written once, here. The
// INSERT and the reads name each table's own columns and stay with its fake.
type Table struct {
	name string // sanitized, schema-qualified
}

// NewTable names schema.table.
func NewTable(schema, table string) Table {
	return Table{name: pgx.Identifier{schema, table}.Sanitize()}
}

// CountRepeat counts a repeat of key and scans the returning columns (what
// the key was for) into dest. The UPDATE's row lock also serialises
// concurrent repeats of one key.
func (t Table) CountRepeat(ctx context.Context, tx pgx.Tx, key, returning string, dest ...any) error {
	return tx.QueryRow(ctx, `
		UPDATE `+t.name+`
		   SET attempts = attempts + 1,
		       last_received_at = now()
		 WHERE idempotency_key = $1
		RETURNING `+returning, key).Scan(dest...)
}

// AcceptAgain updates key's record after a repeat on a fake that is not
// idempotent was accepted: an acceptance overrides an earlier refusal, and
// the earliest completion stands (the first effect takes hold then,
// whatever follows).
func (t Table) AcceptAgain(ctx context.Context, tx pgx.Tx, key string, completesIn time.Duration) error {
	_, err := tx.Exec(ctx, `
		UPDATE `+t.name+`
		   SET outcome = 'ACCEPTED',
		       reject_reason = NULL,
		       completes_at = CASE
		           WHEN outcome = 'ACCEPTED' THEN least(completes_at, now() + $2 * interval '1 millisecond')
		           ELSE now() + $2 * interval '1 millisecond'
		       END
		 WHERE idempotency_key = $1`,
		key, completesIn.Milliseconds())
	return err
}
