package labs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/idempotency"
)

// Lab 3: who executes. "Is there a row? No? Then insert one" is two
// statements, and duplicates arriving together all get "no" before any of
// them inserts. INSERT … ON CONFLICT DO NOTHING asks and answers in one
// statement, against a unique index that lets one row in.
var claimLab = &Lab{
	Number: 3,
	Name:   "claim",
	Title:  "Check-then-insert vs INSERT … ON CONFLICT DO NOTHING",
	Summary: "Three copies of one request at once: check-then-insert runs the work three times, INSERT … ON " +
		"CONFLICT DO NOTHING once.",
	Lesson: "Three copies of one request (a retry storm, a double-click) arrive at once. The naive claim looks for the " +
		"key first and inserts it when it is missing — on a table with no unique constraint, as such code usually " +
		"has. The lab lets all three look before any inserts: each sees no key, each inserts one, and the work runs " +
		"three times. The app's claim, idempotency.Store.Claim, is one INSERT … ON CONFLICT DO NOTHING RETURNING on " +
		"the key's primary key: under the very same schedule one copy gets its row back and executes; the other two " +
		"wait on the index for its commit, get zero rows, and execute nothing.",
	Columns: []Column{
		{Key: "executions", Label: "executions"},
		colEffects, colDuplicates,
		{Key: "refused", Label: "copies turned away"},
	},
	Code: []CodeRef{
		{Path: "internal/idempotency/store.go", Text: "ON CONFLICT (user_id, idempotency_key) DO NOTHING",
			Says: "the claim: one statement decides who executes"},
		{Path: "internal/labs/claim.go", Text: "SELECT count(*)",
			Says: "brokenCheckThenInsertClaim: the check …"},
		{Path: "internal/labs/claim.go", Text: "INSERT INTO claims_without_unique (run_id, key, claimer)",
			Says: "… and the insert, with every copy's check in between"},
	},
	run: runClaim,
}

// claimCopies is how many copies of the request arrive at once.
const claimCopies = 3

func runClaim(ctx context.Context, e *env) ([]Variant, error) {
	broken, err := e.claimRace(ctx, "broken", brokenCheckThenInsertClaim{})
	if err != nil {
		return nil, err
	}
	correct, err := e.claimRace(ctx, "correct", &storeClaim{store: idempotency.NewStore(e.lab, time.Minute, time.Hour)})
	if err != nil {
		return nil, err
	}
	broken.Title = "Check with a SELECT, then INSERT (no unique constraint)"
	correct.Title = "INSERT … ON CONFLICT DO NOTHING RETURNING (idempotency.Store.Claim)"
	return []Variant{broken, correct}, nil
}

// claimer is one way to decide who executes a key.
type claimer interface {
	// fresh returns a claimer for one copy of the request.
	fresh() claimer
	// check runs before the schedule's barrier, in tx.
	check(ctx context.Context, e *env, tx pgx.Tx, key string) (free bool, err error)
	// claim runs after it, in tx: true means "execute".
	claim(ctx context.Context, e *env, tx pgx.Tx, key, who string) (bool, error)
	// complete runs after the work, in tx.
	complete(ctx context.Context, tx pgx.Tx) error
}

// claimRace releases the copies so that every copy has checked before any
// claims: the window the naive claim leaves, held open on purpose.
func (e *env) claimRace(ctx context.Context, variant string, c claimer) (Variant, error) {
	t := newTimeline()
	key := e.name("claim", variant)
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}
	var checked sync.WaitGroup
	checked.Add(claimCopies)
	allChecked := make(chan struct{})
	errs := make([]error, claimCopies)
	executed := make([]bool, claimCopies)
	var done sync.WaitGroup
	for i := range claimCopies {
		done.Add(1)
		go func() {
			defer done.Done()
			who := fmt.Sprintf("copy %d", i+1)
			c := c.fresh()
			passed := false
			errs[i] = pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
				free, err := c.check(ctx, e, tx, key)
				passed = true
				checked.Done()
				if err != nil {
					return err
				}
				t.say(who, "checked: key free = %t", free)
				<-allChecked // every copy has checked; now they claim together
				mine, err := c.claim(ctx, e, tx, key, who)
				if err != nil || !mine {
					if err == nil {
						t.say(who, "the key is taken: nothing to execute")
					}
					return err
				}
				executed[i] = true
				t.say(who, "claimed the key: executes the work")
				if err := e.effect(ctx, tx, "claim", variant, who, "the work"); err != nil {
					return err
				}
				return c.complete(ctx, tx)
			})
			if !passed {
				checked.Done()
			}
		}()
	}
	checked.Wait()
	close(allChecked)
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		return v, fmt.Errorf("claim: %w", err)
	}
	for _, x := range executed {
		if x {
			v.Counts["executions"]++
		} else {
			v.Counts["refused"]++
		}
	}
	var err error
	if v.Counts["effects"], err = e.countEffects(ctx, "claim", variant); err != nil {
		return v, err
	}
	v.Counts["duplicates"] = max(0, v.Counts["effects"]-1)
	if v.Counts["duplicates"] > 0 {
		t.wrong("result", "%d copies of one request each did the work", v.Counts["executions"])
	}
	v.Verdict = fmt.Sprintf("%d of %d copies executed", v.Counts["executions"], claimCopies)
	v.Timeline = t.list()
	return v, nil
}

// brokenCheckThenInsertClaim looks for the key, then inserts it: two
// statements, and nothing in the table to stop a second insert.
type brokenCheckThenInsertClaim struct{}

func (brokenCheckThenInsertClaim) fresh() claimer { return brokenCheckThenInsertClaim{} }

func (brokenCheckThenInsertClaim) check(ctx context.Context, e *env, tx pgx.Tx, key string) (bool, error) {
	var n int
	err := tx.QueryRow(ctx, `
		SELECT count(*)
		  FROM claims_without_unique
		 WHERE run_id = $1
		   AND key = $2`, e.run, key).Scan(&n)
	return n == 0, err
}

func (brokenCheckThenInsertClaim) claim(ctx context.Context, e *env, tx pgx.Tx, key, who string) (bool, error) {
	// The check said "free" a moment ago; by now it may not be, and nothing
	// here can tell.
	_, err := tx.Exec(ctx, `
		INSERT INTO claims_without_unique (run_id, key, claimer)
		VALUES ($1, $2, $3)`, e.run, key, who)
	return err == nil, err
}

func (brokenCheckThenInsertClaim) complete(context.Context, pgx.Tx) error { return nil }

// storeClaim is the app's claim: idempotency.Store.Claim, then Complete.
type storeClaim struct {
	store *idempotency.Store
	c     *idempotency.Claim
}

func (s *storeClaim) fresh() claimer { return &storeClaim{store: s.store} }

// check is what the middleware does before the workflow: a lookup. It
// finds nothing either — it is not what decides.
func (s *storeClaim) check(ctx context.Context, e *env, _ pgx.Tx, key string) (bool, error) {
	_, err := s.store.Lookup(ctx, e.user, key)
	if errors.Is(err, idempotency.ErrNotFound) {
		return true, nil
	}
	return false, err
}

func (s *storeClaim) claim(ctx context.Context, e *env, tx pgx.Tx, key, _ string) (bool, error) {
	var err error
	s.c, err = s.store.Claim(ctx, tx, e.user, key, fingerprintOf("claim", key))
	return s.c != nil, err
}

func (s *storeClaim) complete(ctx context.Context, tx pgx.Tx) error {
	return s.c.Complete(ctx, tx, answerOf("the winner"))
}
