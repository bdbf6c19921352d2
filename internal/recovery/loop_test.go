package recovery_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/recovery/recoverytest"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Three loops on one database and 300 stale operations: every operation is
// claimed exactly once, for both strategies.
func TestThreeLoopsRecoverEachOperationExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, strategy := range []recovery.Strategy{recovery.SkipLocked, recovery.Transition} {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			b := recoverytest.Setup(t)
			// Patient clients: 75 concurrent calls under -race must not time
			// out, or backoffs would add legitimate second claims.
			b.Timeout = 10 * time.Second
			ctx := context.Background()
			const n = 300
			// 300 policies, each with a cancellation whose owner died
			// before calling the provider: IN_PROGRESS, lease over.
			_, err := b.DB.Pool.Exec(ctx, `
				WITH p AS (
				    INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
				    SELECT $1, 'POL-LOAD-' || i, 'Load Test', 10, current_date - 30, current_date + 335
				      FROM generate_series(1, $2) i
				    RETURNING id, user_id),
				o AS (
				    INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
				                            owner_token, owner_id, lease_expires_at)
				    SELECT id, 'CANCEL', user_id, 'k-' || id, 'IN_PROGRESS',
				           gen_random_uuid(), 'request on a dead instance', now() - interval '1 second'
				      FROM p
				    RETURNING id)
				-- their steps: the intent recorded, nothing sent yet
				INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state, finished_at)
				SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system,
				       CASE WHEN s.position = 1 THEN 'DONE' ELSE 'PENDING' END,
				       CASE WHEN s.position = 1 THEN now() END
				  FROM o,
				       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL),
				               (4, 'publish_event', NULL), (5, 'audit', NULL)) AS s(position, name, system)`, b.Alice, n)
			if err != nil {
				t.Fatal(err)
			}
			loops := []recoverytest.Worker{}
			for i := range 3 {
				loops = append(loops, b.Loop(t, fmt.Sprintf("app-%d", i+1), func(c *recovery.Config) { c.Strategy, c.BatchSize = strategy, 25 }))
			}
			var mu sync.Mutex
			var total recovery.Counts
			start := make(chan struct{})
			var wg sync.WaitGroup
			for _, l := range loops {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 100 {
						c, err := l.RunOnce(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						total = recoverytest.Add(total, c)
						mu.Unlock()
						if c.Claimed == 0 && b.Live(t) == 0 {
							return
						}
					}
				}()
			}
			close(start)
			wg.Wait()

			if total.Claimed != n || total.Succeeded != n {
				t.Fatalf("counts %+v; want %d claimed and succeeded", total, n)
			}
			var claimedTwice, claimEvents, perLoop int
			b.DB.Pool.QueryRow(ctx, `
				SELECT count(*) FROM (
				    SELECT operation_id FROM operation_events WHERE branch = 'claimed'
				     GROUP BY operation_id HAVING count(*) <> 1) x`).Scan(&claimedTwice)
			b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE branch = 'claimed'`).Scan(&claimEvents)
			b.DB.Pool.QueryRow(ctx, `SELECT count(DISTINCT actor) FROM operation_events WHERE branch = 'claimed'`).Scan(&perLoop)
			if claimedTwice != 0 || claimEvents != n {
				t.Fatalf("%d operations not claimed exactly once; %d claim events", claimedTwice, claimEvents)
			}
			t.Logf("%s: %d claims spread over %d loops", strategy, claimEvents, perLoop)
			var succeeded, effects int
			b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE status = 'SUCCEEDED'`).Scan(&succeeded)
			b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.effects`).Scan(&effects)
			if succeeded != n || effects != n {
				t.Fatalf("succeeded %d, effects %d; want %d each", succeeded, effects, n)
			}
			recoverytest.CheckInvariants(t, b.DB)
		})
	}
}

// A pass does not wait for its slowest claim (issue 11, item 5): while one
// operation is being polled (its provider says RUNNING for seconds), an
// operation handed over meanwhile is claimed by the next pass — before the
// slow one is finished.
func TestAHandedOverOperationIsNotHeldBackByASlowClaim(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	slow, quick := b.PolicyIDs[0], b.PolicyIDs[1]
	f := fake.DefaultFault()
	f.Mode, f.SlowMS = fake.ModeSlow, 4000
	if _, err := b.Fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	slowOp, _ := b.CancelCrashingAt(t, slow, recoverytest.None) // RUNNING at the provider for 4 s, handed over
	l := b.Loop(t, "app-2", func(c *recovery.Config) {
		c.Interval, c.MaxPolls, c.PollInterval = 100*time.Millisecond, 10, 500*time.Millisecond
	})
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	recoverytest.WaitFor(t, 5*time.Second, func() bool { return slices.Contains(b.Branches(t, slowOp.ID), workflow.BranchPoll) })

	// Now a second cancellation meets a dropped call and is handed over.
	f.Mode = fake.ModeDrop
	if _, err := b.Fake.SetFaults(ctx, f); err != nil {
		t.Fatal(err)
	}
	quickOp, _ := b.CancelCrashingAt(t, quick, recoverytest.None)
	b.SetFaults(t, recoverytest.Faults{Mode: fake.ModeOK, Idempotent: true})
	recoverytest.WaitFor(t, 5*time.Second, func() bool { return slices.Contains(b.Branches(t, quickOp.ID), workflow.BranchClaimed) })
	if op := b.Operation(t, slow); op.Terminal() {
		t.Fatalf("the slow claim finished first (%s): this proves nothing", op.Status)
	}
	recoverytest.WaitFor(t, 20*time.Second, func() bool { return b.Live(t) == 0 })
	stop()
	<-done
	if b.Operation(t, slow).Status != workflow.StatusSucceeded || b.Operation(t, quick).Status != workflow.StatusSucceeded {
		t.Fatal("not both finished")
	}
	recoverytest.CheckInvariants(t, b.DB)
}

// A loop whose every place is taken claims again as soon as a recovery
// frees one, not at its next tick: with a tick of an hour and one place,
// three stale operations drain only if each finished recovery wakes the
// loop. (It used to wait the whole Interval, which capped a drain at
// RECOVERY_BATCH operations a second per loop: 10,000 took minutes.)
func TestALoopWithEveryPlaceTakenClaimsAgainWhenOneFrees(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	seedStale(t, b, 3)
	l := b.Loop(t, "app-2", func(c *recovery.Config) { c.Interval, c.BatchSize = time.Hour, 1 })
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	recoverytest.WaitFor(t, 20*time.Second, func() bool { return b.Live(t) == 0 })
	stop()
	<-done
	recoverytest.CheckInvariants(t, b.DB)
}

// An operation is claimable from when both its lease and its backoff are
// over: the lag is measured from the longest claimable, the claim takes
// the longest claimable first, and one still backing off is neither —
// however long ago its lease ran out. (Ordered by the lease, the claim took
// the operation whose lease ran out first, though it had become claimable
// only lately, and the lag read every live row.)
func TestTheClaimAndTheLagGoByWhenAnOperationBecameClaimable(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	seedStale(t, b, 3)
	now := time.Now().Truncate(time.Second)
	var ids []int64
	if err := b.DB.Pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM operations`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	set := func(id int64, lease, next time.Duration, hasNext bool) {
		t.Helper()
		var at *time.Time
		if hasNext {
			v := now.Add(next)
			at = &v
		}
		if _, err := b.DB.Pool.Exec(ctx, `UPDATE operations SET lease_expires_at = $2, next_attempt_at = $3 WHERE id = $1`,
			id, now.Add(lease), at); err != nil {
			t.Fatal(err)
		}
	}
	set(ids[0], -10*time.Minute, -30*time.Second, true) // lease over long ago, backoff over 30 s ago
	set(ids[1], -time.Minute, 0, false)                 // lease over a minute ago, no backoff
	set(ids[2], -20*time.Minute, time.Minute, true)     // still backing off
	b.Engine.Clock().Set(now)

	age, err := b.Engine.StaleAge(ctx)
	if err != nil || age != time.Minute {
		t.Fatalf("lag %s (%v), want 1m0s: claimable a minute ago, the backed-off one not at all", age, err)
	}
	claims, err := b.Engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.SkipLocked, Actor: "the test", Lease: time.Minute, Limit: 1})
	if err != nil || len(claims) != 1 || claims[0].ID != ids[1] {
		t.Fatalf("first claim %v (%v), want operation %d, claimable longest", claimedIDs(claims), err, ids[1])
	}
	claims, err = b.Engine.ClaimStale(ctx, recovery.ClaimRequest{Strategy: recovery.Transition, Actor: "the test", Lease: time.Minute, Limit: 5})
	if err != nil || len(claims) != 1 || claims[0].ID != ids[0] {
		t.Fatalf("next claims %v (%v), want only operation %d: %d is backing off", claimedIDs(claims), err, ids[0], ids[2])
	}
}

func claimedIDs(claims []recovery.Claim) []int64 {
	ids := make([]int64, len(claims))
	for i, c := range claims {
		ids[i] = c.ID
	}
	return ids
}

// Two recovery loops racing on the same stale workflows: each operation is
// claimed by one of them, and every call of each of its steps is made by
// that one owner (the calls' owner tokens), never by both.
func TestTwoLoopsRacingOnOneWorkflowEachStepCalledByOneOwner(t *testing.T) {
	t.Parallel()
	b := recoverytest.Setup(t)
	ctx := context.Background()
	b.Timeout = 10 * time.Second // patient: a timeout here would add a legitimate second attempt
	for _, pid := range b.PolicyIDs {
		if _, err := b.CancelCrashingAt(t, pid, "before_provider_cancel"); err != nil {
			t.Fatal(err)
		}
	}
	// Their owner died: the lease ran out.
	if _, err := b.DB.Pool.Exec(ctx, `UPDATE operations SET lease_expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	loops := []recoverytest.Worker{
		b.Loop(t, "app-1", func(c *recovery.Config) { c.BatchSize, c.ClockSkew = 1, 0 }),
		b.Loop(t, "app-2", func(c *recovery.Config) { c.BatchSize, c.ClockSkew = 1, 0 }),
	}
	// The first calls' deadlines (the dead request's) must pass first.
	time.Sleep(recoverytest.ProviderTimeout)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 40 {
				if _, err := l.RunOnce(ctx); err != nil {
					t.Error(err)
					return
				}
				if b.Live(t) == 0 {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	var owners, claims, actors int
	b.DB.Pool.QueryRow(ctx, `
		SELECT count(*) FROM (
		    SELECT c.step_key
		      FROM operation_calls c
		     WHERE c.kind = 'call' AND c.actor LIKE 'recovery on %'
		     GROUP BY c.step_key
		    HAVING count(DISTINCT c.owner_token) > 1) x`).Scan(&owners)
	b.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM operation_events WHERE branch = 'claimed'`).Scan(&claims)
	b.DB.Pool.QueryRow(ctx, `SELECT count(DISTINCT actor) FROM operation_events WHERE branch = 'claimed'`).Scan(&actors)
	if owners != 0 || claims != len(b.PolicyIDs) {
		t.Fatalf("%d steps called by more than one owner; %d claims for %d operations", owners, claims, len(b.PolicyIDs))
	}
	t.Logf("%d operations claimed by %d loops", claims, actors)
	for _, pid := range b.PolicyIDs {
		if op := b.Operation(t, pid); op.Status != workflow.StatusSucceeded || b.Effects(t, pid) != 1 || b.Refunds(t, pid) != 1 {
			t.Fatalf("policy %d: %s, effects %d, refunds %d", pid, op.Status, b.Effects(t, pid), b.Refunds(t, pid))
		}
	}
	recoverytest.CheckInvariants(t, b.DB)
}
