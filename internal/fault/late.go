package fault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// ErrLate reports a call that arrived after its Request-Deadline: refused,
// nothing applied. The error is a *LateError.
var ErrLate = errors.New("fault: arrived after its deadline")

// LateError is one refused late call.
type LateError struct {
	Key       string
	Deadline  time.Time
	ArrivedAt time.Time
}

// Late is by how much the call missed its deadline.
func (e *LateError) Late() time.Duration { return e.ArrivedAt.Sub(e.Deadline) }

func (e *LateError) Error() string {
	return fmt.Sprintf("%s arrived %s after its deadline (%s); refused, nothing was done",
		e.Key, humanDuration(e.Late()), e.Deadline.UTC().Format(time.RFC3339Nano))
}

func (e *LateError) Is(target error) bool { return target == ErrLate }

// humanDuration writes 1.3 s or 45 ms.
func humanDuration(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// LateArrival is one line of a fake's ledger of refused late calls.
type LateArrival struct {
	Key       string    `json:"key"`
	PolicyID  *int64    `json:"policy_id,omitempty"`
	BookingID *int64    `json:"booking_id,omitempty"`
	Deadline  time.Time `json:"deadline"`
	ArrivedAt time.Time `json:"arrived_at"`
	LateMS    int64     `json:"late_ms"`
	// Message says it for people: "op-1:refund arrived 1.3 s after its deadline …".
	Message string `json:"message"`
}

// LateArrivals is the late-arrival part of a fake's ledger: how many calls
// were refused for arriving after their deadline, and the most recent ones.
type LateArrivals struct {
	Total  int64         `json:"total"`
	Recent []LateArrival `json:"recent"`
}

// recentLate bounds the list a ledger carries; Total counts them all.
const recentLate = 100

// Late returns the late-arrival ledger, newest first. It takes db so a fake
// reads it in the same snapshot as the rest of its ledger.
func (s *Store) Late(ctx context.Context, db database.DBTX) (LateArrivals, error) {
	la := LateArrivals{Recent: []LateArrival{}}
	if err := db.QueryRow(ctx, `
		SELECT count(*)
		  FROM fault.late_arrivals
		 WHERE system = $1`, s.system).Scan(&la.Total); err != nil {
		return LateArrivals{}, fmt.Errorf("fault: %s late arrivals: %w", s.system, err)
	}
	rows, err := db.Query(ctx, `
		SELECT idempotency_key, subject, deadline, arrived_at
		  FROM fault.late_arrivals
		 WHERE system = $1
		 ORDER BY id DESC
		 LIMIT $2`, s.system, recentLate)
	if err != nil {
		return LateArrivals{}, fmt.Errorf("fault: %s late arrivals: %w", s.system, err)
	}
	la.Recent, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (LateArrival, error) {
		var l LateArrival
		var subject *string
		if err := row.Scan(&l.Key, &subject, &l.Deadline, &l.ArrivedAt); err != nil {
			return l, err
		}
		if subject != nil {
			l.PolicyID, l.BookingID = Subject(*subject).ids()
		}
		e := LateError{Key: l.Key, Deadline: l.Deadline, ArrivedAt: l.ArrivedAt}
		l.LateMS, l.Message = e.Late().Milliseconds(), e.Error()
		return l, nil
	})
	if err != nil {
		return LateArrivals{}, fmt.Errorf("fault: %s late arrivals: %w", s.system, err)
	}
	return la, nil
}
