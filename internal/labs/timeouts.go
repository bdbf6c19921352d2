package labs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/workflow"
)

// Lab 10: the timeout lab, for real. Three timeouts that look the same to
// the app — the call never got in, it got in and the answer was lost, it is
// still running — and the one thing that tells them apart: asking the
// provider afterwards. This lab runs the app's real cancellation workflow
// against the real provider and lets the real recovery loop finish each;
// there is no broken variant, only three faults side by side.
var timeoutsLab = &Lab{
	Number: 10,
	Name:   "timeouts",
	Title:  "The timeout lab, for real",
	Summary: "Three faults that look the same to the app — drop, lost_response, slow — on three real " +
		"cancellations, and how recovery tells them apart, live.",
	Lesson: "One click cancels three policies, and the provider meets each first call with a different fault: drop " +
		"(the call never gets in), lost_response (it is applied, the answer never comes back) and slow (it is " +
		"accepted and completes later than the app waits). To the app all three are the same timeout: each " +
		"operation stays IN_PROGRESS and is handed to recovery. The three operations are shown side by side, live, " +
		"until recovery finishes each: it asks the provider for the truth of each step key — NOT_STARTED (once the " +
		"deadline has passed: the same call again), COMPLETED (finish locally), RUNNING (poll until COMPLETED) — and " +
		"the provider's ledger shows what it really did: one cancellation per policy, never two. The policies " +
		"belong to the lab's own account, timeout-lab, never to a customer.",
	Columns: []Column{
		{Key: "executions", Label: "first calls"},
		{Key: "timeouts", Label: "timed out"},
	},
	RunHint: "Three real cancellations of the lab's own policies, one fault each; recovery finishes them while you watch.",
	Code: []CodeRef{
		{Path: "internal/workflow/recover.go", Text: "func (e *Engine) Recover(ctx context.Context, c recovery.Claim, b recovery.Budget) (recovery.Result, error) {",
			Says: "the decision tree recovery runs for each of the three operations"},
		{Path: "internal/workflow/recover.go", Text: "case external.TruthCompleted:",
			Says: "COMPLETED (lost_response; slow, once it completes): finished locally, no second call"},
		{Path: "internal/workflow/recover.go", Text: "case external.TruthNotStarted:",
			Says: "NOT_STARTED (drop): the same call again, with the same key, once every earlier deadline has passed"},
	},
	run: runTimeouts,
}

// TimeoutLabAccount owns the timeout lab's policies. It has no password
// and no token anybody knows: nobody signs in as it.
const TimeoutLabAccount = "timeout-lab"

// timeoutModes are the three faults, in the order shown.
var timeoutModes = []fault.Mode{fault.ModeDrop, fault.ModeLostResponse, fault.ModeSlow}

func runTimeouts(ctx context.Context, e *env) ([]Variant, error) {
	d := e.cfg.Timeouts
	if d == nil || d.Canceller == nil || d.Provider == nil {
		return nil, fmt.Errorf("%w: the timeout lab needs the app's cancellation workflow", ErrUnavailable)
	}
	owner, ids, err := e.timeoutPolicies(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Variant, len(timeoutModes))
	errs := make([]error, len(timeoutModes))
	ops := make([]int64, len(timeoutModes))
	var wg sync.WaitGroup
	for i, mode := range timeoutModes {
		f := fault.Default()
		f.Mode, f.PolicyID, f.Next = mode, &ids[i], 1
		// slow: accepted, and complete only well after the app stops waiting
		f.SlowMS = int((d.ProviderTimeout + 2*time.Second).Milliseconds())
		if _, err := d.Provider.SetFaults(ctx, f); err != nil {
			// The provider's control API is away: the lab cannot run (503
			// lab-unavailable), and it is not the database's fault. The
			// cause names hosts: the log has it, the reader the variable.
			e.cfg.Logger.Warn("labs: the timeout lab cannot schedule the provider's faults", "run", e.run, "mode", mode, "err", err)
			return nil, fmt.Errorf("%w: the provider's control API does not answer (PROVIDER_URL); the app's log has the cause", ErrUnavailable)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := newTimeline()
			v := Variant{Name: string(mode), Title: "provider: " + string(mode), Counts: map[string]int{}}
			t.say("lab", "policy %d: the provider's next call about it is %s", ids[i], mode)
			op, err := d.Canceller.Cancel(ctx, policies.CancelRequest{
				UserID: owner, PolicyID: ids[i], Reason: "the timeout lab: " + string(mode),
				RequestKey: e.name("timeouts", string(mode)), Actor: fmt.Sprintf("the timeout lab (run %d)", e.run),
			}, workflow.Hooks[workflow.Operation]{})
			if err != nil {
				errs[i] = err
				return
			}
			ops[i] = op.ID
			v.Counts["executions"] = 1
			if op.Status == workflow.StatusInProgress {
				v.Counts["timeouts"] = 1
				t.say("app", "operation %d: the provider did not answer in %s — IN_PROGRESS, handed to recovery", op.ID, d.ProviderTimeout)
			} else {
				t.say("app", "operation %d: %s", op.ID, op.Status)
			}
			v.Verdict = fmt.Sprintf("operation %d is %s; recovery finishes it", op.ID, op.Status)
			v.Timeline = t.list()
			out[i] = v
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.operations = ops
	e.mu.Unlock()
	return out, nil
}

// timeoutPolicies makes three active policies of the lab's account (made
// on first use) and returns the account and the policies' ids.
func (e *env) timeoutPolicies(ctx context.Context) (int64, []int64, error) {
	var owner int64
	ids := make([]int64, len(timeoutModes))
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		secret := make([]byte, 32)
		rand.Read(secret)
		hash := sha256.Sum256(secret) // a token nobody has, for a column that requires one
		err := tx.QueryRow(ctx, `
			INSERT INTO users (name, role, api_token_sha256)
			VALUES ($1, 'customer', $2)
			    ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name -- the account exists: take its id
			RETURNING id`, TimeoutLabAccount, hash[:]).Scan(&owner)
		if err != nil {
			return err
		}
		for i, mode := range timeoutModes {
			err := tx.QueryRow(ctx, `
				INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
				VALUES ($1, $2, 'Timeout Lab', 100.00, current_date - 30, current_date + 335)
				RETURNING id`, owner, fmt.Sprintf("LAB-%d-%s", e.run, mode)).Scan(&ids[i])
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("labs: timeouts: policies: %w", err)
	}
	return owner, ids, nil
}
