package operations

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/database"
)

// Statuses are an operation's statuses, live ones first, as the list counts
// them (internal/workflow owns their meaning).
var Statuses = []string{"IN_PROGRESS", "RECOVERING", "SUCCEEDED", "FAILED", "NEEDS_RECONCILIATION"}

// CountCap is where the list's counts stop counting: past it a count is
// "at least CountCap". An exact count of a million SUCCEEDED operations is
// a read of a million rows on every view of the list; the first CountCap
// are enough to say "many".
const CountCap = 1_000

// Filter narrows List and Counts. A zero field means "any".
type Filter struct {
	// OwnerID restricts the list to one customer's operations: a customer
	// always lists with their own id, an admin with 0.
	OwnerID int64
	Status  string
	Kind    string // the operation type: CANCEL, BOOK_DEPOSIT, CANCEL_DEPOSIT
	User    string // the owner's name (an admin's filter)
	// WaitingOn is a system that a step of the operation's current run was
	// sent to and has not answered for (the step is SENT or UNKNOWN).
	WaitingOn string
	// Since and Until bound created_at: Since ≤ created_at < Until.
	Since, Until time.Time
	// FinishedSince and FinishedUntil bound finished_at the same way (an
	// operation not finished has none, so either leaves it out).
	FinishedSince, FinishedUntil time.Time
	// BeforeID is the cursor: only operations with a smaller id, since the
	// list is newest first.
	BeforeID int64
	Limit    int
}

// Row is one operation as the list shows it.
type Row struct {
	ID         int64      `json:"id"`
	Kind       string     `json:"operation_type"`
	PolicyID   int64      `json:"policy_id,omitempty"`
	BookingID  int64      `json:"booking_id,omitempty"`
	UserID     int64      `json:"user_id"`
	User       string     `json:"user"`
	Status     string     `json:"status"`
	Run        int        `json:"run"`
	CreatedAt  time.Time  `json:"created_at"`
	FinishedAt *time.Time `json:"finished_at"`
	// WaitingOn is the system whose answer the current step waits for
	// (nil: none), and Step that step's name.
	WaitingOn *string `json:"waiting_on"`
	Step      *string `json:"waiting_step"`
	URL       string  `json:"url"`
}

// List returns the operations f selects, newest first, at most f.Limit.
// Each row names the step its operation waits on, if any: one index lookup
// per row of the page, never a join over every step.
func List(ctx context.Context, db database.DBTX, f Filter) ([]Row, error) {
	var w where
	w.filter(f)
	if f.Status != "" {
		w.add("o.status = $?", f.Status)
	}
	if f.BeforeID > 0 {
		w.add("o.id < $?", f.BeforeID)
	}
	limit := w.arg(f.Limit)
	rows, err := db.Query(ctx, `
		SELECT o.id, o.operation_type, coalesce(o.policy_id, 0), coalesce(o.booking_id, 0), o.user_id,
		       (SELECT u.name FROM users u WHERE u.id = o.user_id), -- per row of the page, not a join the planner could hash
		       o.status, o.run, o.created_at, o.finished_at, waiting.system, waiting.name
		  FROM operations o
		  LEFT JOIN LATERAL (
		        SELECT s.system, s.name
		          FROM operation_steps s
		         WHERE s.operation_id = o.id
		           AND s.run = o.run
		           AND s.state IN ('SENT', 'UNKNOWN') -- called, no answer yet
		         ORDER BY s.position
		         LIMIT 1) waiting ON true
		 WHERE `+w.String()+`
		 ORDER BY o.id DESC -- newest first: the primary key read backwards
		 LIMIT `+limit, w.args...)
	if err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var r Row
		err := row.Scan(&r.ID, &r.Kind, &r.PolicyID, &r.BookingID, &r.UserID, &r.User,
			&r.Status, &r.Run, &r.CreatedAt, &r.FinishedAt, &r.WaitingOn, &r.Step)
		r.URL = "/api/v1/operations/" + strconv.FormatInt(r.ID, 10)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("operations: list: %w", err)
	}
	return list, nil
}

// Count is how many operations f selects in one status, up to CountCap.
type Count struct {
	Status string `json:"status"`
	N      int    `json:"count"`
	// AtLeast: N is CountCap and there are more.
	AtLeast bool `json:"at_least,omitempty"`
}

// Counts counts the operations f selects in each status (f.Status, the
// cursor and the limit aside), each count stopping at CountCap. One
// statement; each status is a literal in it, so the planner can use that
// status's partial index (operations_failed_idx, _stale_idx, _reconcile_idx).
func Counts(ctx context.Context, db database.DBTX, f Filter) ([]Count, error) {
	var w where
	w.filter(f)
	capArg := w.arg(CountCap + 1)
	parts := make([]string, len(Statuses))
	for i, s := range Statuses {
		// s is one of the constants above, never input.
		parts[i] = fmt.Sprintf(`SELECT %d, count(*) FROM (
			SELECT 1 FROM operations o
			 WHERE o.status = '%s' AND %s
			 LIMIT %s) AS c`, i, s, w.String(), capArg)
	}
	rows, err := db.Query(ctx, strings.Join(parts, "\nUNION ALL\n")+"\nORDER BY 1", w.args...)
	if err != nil {
		return nil, fmt.Errorf("operations: counts: %w", err)
	}
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Count, error) {
		var i, n int
		err := row.Scan(&i, &n)
		c := Count{Status: Statuses[i], N: min(n, CountCap), AtLeast: n > CountCap}
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("operations: counts: %w", err)
	}
	return counts, nil
}

// where builds a WHERE clause of the filters that are set, and nothing
// else: a clause like "($1 IS NULL OR status = $1)" gets one generic plan for
// every combination, and that plan reads the whole table.
type where struct {
	conds []string
	args  []any
}

// arg adds v as the next placeholder and returns it ("$3").
func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

// add adds cond, its "$?" replaced by v's placeholder.
func (w *where) add(cond string, v any) {
	w.conds = append(w.conds, strings.Replace(cond, "$?", w.arg(v), 1))
}

func (w *where) String() string {
	if len(w.conds) == 0 {
		return "true"
	}
	return strings.Join(w.conds, "\n		   AND ")
}

// filter adds every filter of f but the status, the cursor and the limit.
func (w *where) filter(f Filter) {
	if f.OwnerID != 0 {
		w.add("o.user_id = $?", f.OwnerID)
	}
	if f.Kind != "" {
		w.add("o.operation_type = $?", f.Kind)
	}
	if f.User != "" {
		// an init plan: the user's id once, then operations_user_idx
		w.add("o.user_id = (SELECT u.id FROM users u WHERE u.name = $?)", f.User)
	}
	if f.WaitingOn != "" {
		w.add(`EXISTS (SELECT 1 FROM operation_steps s
		                WHERE s.operation_id = o.id
		                  AND s.run = o.run
		                  AND s.state IN ('SENT', 'UNKNOWN')
		                  AND s.system = $?)`, f.WaitingOn)
	}
	if !f.Since.IsZero() {
		w.add("o.created_at >= $?", f.Since)
	}
	if !f.Until.IsZero() {
		w.add("o.created_at < $?", f.Until)
	}
	if !f.FinishedSince.IsZero() {
		w.add("o.finished_at >= $?", f.FinishedSince)
	}
	if !f.FinishedUntil.IsZero() {
		w.add("o.finished_at < $?", f.FinishedUntil)
	}
}
