package labs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/internal/workflow"
)

// catalogue is every lab, in the order of the list.
var catalogue = []*Lab{
	redisLab,
	fencingLab,
	claimLab,
	inboxLab,
	relayLab,
	nullLab,
	compensationLab,
	beliefLab,
	statusLab,
	timeoutsLab,
	callbacksLab,
	orderingLab,
	failoverLab,
}

// The lines are found once, at start-up: the embedded source cannot change.
func init() {
	for _, l := range catalogue {
		for i := range l.Code {
			l.Code[i].Line = idemlab.LineOf(l.Code[i].Path, l.Code[i].Text)
		}
	}
}

// All lists the labs in order.
func All() []Lab {
	out := make([]Lab, len(catalogue))
	for i, l := range catalogue {
		out[i] = *l
	}
	return out
}

// Find returns the lab called name.
func Find(name string) (Lab, bool) {
	for _, l := range catalogue {
		if l.Name == name {
			return *l, true
		}
	}
	return Lab{}, false
}

// Run is one finished run of a lab: every variant, in order.
type Run struct {
	ID         int64     `json:"id"`
	Lab        string    `json:"lab"`
	UserID     int64     `json:"user_id"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Variants   []Variant `json:"variants"`
	// Operations are the timeout lab's cancellations, followed live on its
	// page and in GET …/runs/{id}.
	Operations []int64 `json:"operations,omitempty"`
}

// storedResult is what labs.runs.result holds.
type storedResult struct {
	Variants   []Variant `json:"variants"`
	Operations []int64   `json:"operations,omitempty"`
}

// RunRequest asks for one run of a lab.
type RunRequest struct {
	Lab    string
	UserID int64
}

// keptRuns is how many runs of each lab a user keeps; older ones are
// deleted in the commit of the next.
const keptRuns = 20

// Run runs the lab for the user as a one-commit workflow (see the package
// doc): hooks.Begin claims the request's key, the scenario runs on the
// lab's own connections, the result is inserted and hooks.Finish stores the
// answer — one commit, or none. It returns ErrUnknownLab before anything
// runs, ErrUnavailable when the lab needs what this process lacks, or the
// scenario's failure, after which nothing was committed.
func (l *Labs) Run(ctx context.Context, req RunRequest, hooks workflow.Hooks[Run]) (Run, error) {
	lab, ok := Find(req.Lab)
	if !ok {
		return Run{}, ErrUnknownLab
	}
	var run Run
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := hooks.RunBegin(ctx, tx); err != nil {
			return err // a duplicate of this request waited here, and answers from the key
		}
		var err error
		if run, err = l.runScenario(ctx, lab, req.UserID); err != nil {
			return err
		}
		res := storedResult{Variants: run.Variants, Operations: run.Operations}
		err = tx.QueryRow(ctx, `
			INSERT INTO labs.runs (id, lab, user_id, started_at, finished_at, result)
			VALUES ($1, $2, $3, $4, clock_timestamp(), $5)
			RETURNING finished_at`, run.ID, run.Lab, run.UserID, run.StartedAt, res).Scan(&run.FinishedAt)
		if err != nil {
			return fmt.Errorf("labs: record run: %w", err)
		}
		_, err = tx.Exec(ctx, `
			DELETE FROM labs.runs
			 WHERE user_id = $1
			   AND lab = $2
			   -- the user's newest runs of this lab stay
			   AND id < (SELECT min(id)
			               FROM (SELECT id
			                       FROM labs.runs
			                      WHERE user_id = $1
			                        AND lab = $2
			                      ORDER BY id DESC
			                      LIMIT $3) AS newest)`, run.UserID, run.Lab, keptRuns)
		if err != nil {
			return fmt.Errorf("labs: forget old runs: %w", err)
		}
		return hooks.RunFinish(ctx, tx, run, nil)
	})
	if err != nil {
		return Run{}, err
	}
	return run, nil
}

// runScenario runs every variant of lab under a new run id and deletes the
// run's scratch rows afterwards, whatever happened.
func (l *Labs) runScenario(ctx context.Context, lab Lab, userID int64) (Run, error) {
	run := Run{Lab: lab.Name, UserID: userID}
	if err := l.lab.QueryRow(ctx, `SELECT nextval('labs.run_ids'), now()`).Scan(&run.ID, &run.StartedAt); err != nil {
		return Run{}, fmt.Errorf("labs: new run: %w", err)
	}
	e := &env{Labs: l, run: run.ID, user: userID}
	defer e.cleanup()
	variants, err := lab.run(ctx, e)
	if err != nil {
		return Run{}, fmt.Errorf("labs: %s: %w", lab.Name, err)
	}
	for i := range variants {
		// The promise held when none of the counts that must stay zero is above it.
		variants[i].Held = lab.held(variants[i])
		if variants[i].Counts == nil {
			variants[i].Counts = map[string]int{}
		}
		if variants[i].Timeline == nil {
			variants[i].Timeline = []Event{}
		}
	}
	run.Variants, run.Operations = variants, e.operations
	return run, nil
}

// Get returns run id of lab, if the user ran it (an admin sees every run).
func (l *Labs) Get(ctx context.Context, lab string, id, userID int64, asAdmin bool) (Run, error) {
	rows, err := l.pool.Query(ctx, `
		SELECT id, lab, user_id, started_at, finished_at, result
		  FROM labs.runs
		 WHERE id = $1
		   AND lab = $2
		   -- someone else's run is "not found", as any other row of theirs
		   AND (user_id = $3 OR $4)`, id, lab, userID, asAdmin)
	if err != nil {
		return Run{}, fmt.Errorf("labs: run %d: %w", id, err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanRun)
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, ErrRunNotFound
	}
	if err != nil {
		return Run{}, fmt.Errorf("labs: run %d: %w", id, err)
	}
	return r, nil
}

// Latest returns the user's newest runs of lab, newest first.
func (l *Labs) Latest(ctx context.Context, lab string, userID int64, limit int) ([]Run, error) {
	rows, err := l.pool.Query(ctx, `
		SELECT id, lab, user_id, started_at, finished_at, result
		  FROM labs.runs
		 WHERE user_id = $1
		   AND lab = $2
		 ORDER BY id DESC
		 LIMIT $3`, userID, lab, limit)
	if err != nil {
		return nil, fmt.Errorf("labs: runs of %s: %w", lab, err)
	}
	runs, err := pgx.CollectRows(rows, scanRun)
	if err != nil {
		return nil, fmt.Errorf("labs: runs of %s: %w", lab, err)
	}
	return runs, nil
}

func scanRun(row pgx.CollectableRow) (Run, error) {
	var r Run
	var res storedResult
	if err := row.Scan(&r.ID, &r.Lab, &r.UserID, &r.StartedAt, &r.FinishedAt, &res); err != nil {
		return Run{}, err
	}
	r.Variants, r.Operations = res.Variants, res.Operations
	return r, nil
}
