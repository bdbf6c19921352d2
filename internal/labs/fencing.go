package labs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/pause"
)

// Lab 2: fencing. An owner that stalls past its lease is not dead, only
// late: when it wakes it still believes it owns the key. The fence — every
// owner write carries AND owner_token = $mine — makes its late write change
// zero rows; without it, the stale owner's write lands on top of the new
// owner's outcome.
var fencingLab = &Lab{
	Number: 2,
	Name:   "fencing",
	Title:  "Fencing off and on",
	Summary: "A request that stalls past its lease writes after its retry has finished: without the owner " +
		"condition its late write counts, with it the write changes nothing.",
	Lesson: "Request A claims a key and stalls (a garbage-collection pause, a slow provider) past its lease. " +
		"Its retry B takes the key over, does the work and stores its answer. Then A wakes up and, still believing it " +
		"owns the key, does the work too and stores its own answer. Without the owner condition on that write, A's " +
		"late effect commits and its answer overwrites B's: two effects, and the answer every replay sends has " +
		"changed. With it (idempotency.Store.Complete), A's write changes zero rows, ErrLeaseLost rolls its " +
		"transaction back, and the refusal is counted.",
	Columns: []Column{
		colExecutions, colEffects, colDuplicates,
		{Key: "lost", Label: "outcomes overwritten", Bad: true},
		{Key: "refused", Label: "late writes refused"},
	},
	Code: []CodeRef{
		{Path: "internal/idempotency/store.go", Text: "AND owner_token = $3",
			Says: "the fence: only the current owner completes the key"},
		{Path: "internal/idempotency/store.go", Text: "return ErrLeaseLost",
			Says: "zero rows is a named error, and the owner's transaction rolls back"},
		{Path: "internal/labs/fencing.go", Text: "-- no owner condition: a stale owner's write lands on the new owner's",
			Says: "brokenUnfencedComplete: the same write without the fence"},
	},
	run: runFencing,
}

// fencingLease is the lease A outlives. Short, so B's take-over comes soon;
// the schedule, not the length, decides who writes when.
const fencingLease = 150 * time.Millisecond

func runFencing(ctx context.Context, e *env) ([]Variant, error) {
	broken, err := e.fencing(ctx, "broken", brokenUnfencedComplete)
	if err != nil {
		return nil, err
	}
	correct, err := e.fencing(ctx, "correct", fencedComplete)
	if err != nil {
		return nil, err
	}
	broken.Title = "Without the owner condition"
	correct.Title = "With AND owner_token = $mine (idempotency.Store.Complete)"
	return []Variant{broken, correct}, nil
}

// completeFunc stores an owner's answer in its transaction.
type completeFunc func(ctx context.Context, tx pgx.Tx, s *idempotency.Store, c *idempotency.Claim, resp idempotency.Response) error

// fencing runs the schedule once:
//
//	A: claim, commit · stall ─────────────────────────────▶ wake: effect + complete
//	B:                  lease expired → take over · effect + complete, commit
//
// A wakes only after B committed (a channel), so the order is the same every run.
func (e *env) fencing(ctx context.Context, variant string, complete completeFunc) (Variant, error) {
	t := newTimeline()
	store := idempotency.NewStore(e.lab, fencingLease, time.Hour)
	key := e.name("fencing", variant)
	fp := fingerprintOf("fencing", variant)
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}

	// A claims and commits: from now on it "calls the provider" and stalls.
	var a *idempotency.Claim
	err := pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		var err error
		a, err = store.Claim(ctx, tx, e.user, key, fp)
		return err
	})
	if err != nil || a == nil {
		return v, fmt.Errorf("fencing: A's claim: %v", err)
	}
	t.say("A", "claimed the key (lease %s) and committed; calls the provider and stalls", fencingLease)

	// B, a retry of the same request, takes over once A's lease has run out.
	b, err := takeOverWhenExpired(ctx, e, store, key, fp)
	if err != nil {
		return v, err
	}
	t.say("B", "A's lease expired: took the key over with a new owner token")
	err = pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		if err := e.effect(ctx, tx, "fencing", variant, "B", "the work"); err != nil {
			return err
		}
		return store.Complete(ctx, tx, b, answerOf("B"))
	})
	if err != nil {
		return v, fmt.Errorf("fencing: B's completion: %w", err)
	}
	v.Counts["executions"]++
	t.say("B", "did the work and stored its answer (200, done by B) — committed")

	// A wakes up, does its work and writes its outcome as if nothing happened.
	t.say("A", "wakes up, still believing it owns the key: does the work and stores its answer")
	v.Counts["executions"]++
	err = pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		if err := e.effect(ctx, tx, "fencing", variant, "A", "the work"); err != nil {
			return err
		}
		return complete(ctx, tx, store, a, answerOf("A"))
	})
	switch {
	case errors.Is(err, idempotency.ErrLeaseLost):
		v.Counts["refused"]++
		t.say("A", "its write matched zero rows (owner token replaced): ErrLeaseLost, its transaction rolled back — effect included")
	case err != nil:
		return v, fmt.Errorf("fencing: A's completion: %w", err)
	default:
		t.wrong("A", "its late write changed a row: its effect committed and its answer replaced B's")
	}

	// What a replay would send now, and how many effects committed.
	rec, err := store.Lookup(ctx, e.user, key)
	if err != nil {
		return v, fmt.Errorf("fencing: lookup: %w", err)
	}
	if string(rec.Response.Body) != string(answerOf("B").Body) {
		v.Counts["lost"]++
		t.wrong("replay", "now sends %q: B's outcome is gone", rec.Response.Body)
	} else {
		t.say("replay", "sends %q, B's answer, as it will every time", rec.Response.Body)
	}
	if v.Counts["effects"], err = e.countEffects(ctx, "fencing", variant); err != nil {
		return v, err
	}
	v.Counts["duplicates"] = max(0, v.Counts["effects"]-1)
	v.Verdict = plural(v.Counts["effects"], "effect") + "; the stored answer is " + string(rec.Response.Body)
	v.Timeline = t.list()
	return v, nil
}

// takeOverWhenExpired retries TakeOver until the lease has run out (the
// database clock decides), bounded.
func takeOverWhenExpired(ctx context.Context, e *env, store *idempotency.Store, key string, fp []byte) (*idempotency.Claim, error) {
	bound := time.Now().Add(10 * time.Second)
	for time.Now().Before(bound) {
		var c *idempotency.Claim
		err := pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
			var err error
			c, err = store.TakeOver(ctx, tx, e.user, key, fp)
			return err
		})
		if err != nil || c != nil {
			return c, err
		}
		if !pause.For(ctx, 20*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	return nil, errors.New("labs: the lease never ran out")
}

// fencedComplete is the app's completion: idempotency.Store.Complete.
func fencedComplete(ctx context.Context, tx pgx.Tx, s *idempotency.Store, c *idempotency.Claim, resp idempotency.Response) error {
	return s.Complete(ctx, tx, c, resp)
}

// brokenUnfencedComplete is Store.Complete without its fence: it writes
// the outcome for the key whoever owns it now (and whatever it holds).
func brokenUnfencedComplete(ctx context.Context, tx pgx.Tx, _ *idempotency.Store, c *idempotency.Claim, resp idempotency.Response) error {
	_, err := tx.Exec(ctx, `
		UPDATE idempotency_keys
		   SET status = 'COMPLETED',
		       response_status = $3,
		       response_headers = '{}',
		       response_body = $4,
		       completed_at = now()
		 WHERE user_id = $1
		   -- no owner condition: a stale owner's write lands on the new owner's
		   AND idempotency_key = $2`,
		c.UserID, c.Key, resp.Status, resp.Body)
	return err
}

func answerOf(owner string) idempotency.Response {
	return idempotency.Response{Status: http.StatusOK, Body: []byte("done by " + owner)}
}
