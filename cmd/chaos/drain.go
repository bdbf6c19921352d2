package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/workload"
)

// backlog is what the system still has to do after the heal: operations
// live or waiting for a person that recovery will ask again, keys in
// progress, events not yet applied by every consumer. An operation waiting
// for a person with no next question (a refund refused after the policy
// was cancelled: a definite answer, and what was done elsewhere stands) is
// a person's by design: the drain does not wait for it, the last-resort
// check judges it.
type backlog struct {
	live, waiting, keys int64
	decided             int64 // waiting for a person, never asked again
	unsorted            bool  // more waiting than the list shows: not told apart
	pending, unapplied  int64
}

func (b backlog) empty() bool {
	return b.live == 0 && b.waiting == 0 && b.keys == 0 && b.pending == 0 && b.unapplied == 0
}

func (b backlog) String() string {
	waiting := fmt.Sprintf("%d waiting for a person to be asked again (and %d for a person's decision)", b.waiting, b.decided)
	if b.unsorted {
		waiting = fmt.Sprintf("%d waiting for a person (more than the 100 the list shows: asked again or a person's decision, not told apart)", b.waiting)
	}
	return fmt.Sprintf("%d operations live, %s, %d keys in progress, %d events pending, %d deliveries to consumers missing",
		b.live, waiting, b.keys, b.pending, b.unapplied)
}

// readBacklog asks GET /api/v1/invariants for the counts and GET
// /api/v1/events for the outbox and its consumers.
func (r *chaosRun) readBacklog(ctx context.Context) (backlog, error) {
	var inv struct {
		Counts struct {
			OperationsByStatus map[string]int64 `json:"operations_by_status"`
			KeysInProgress     int64            `json:"keys_in_progress"`
		} `json:"counts"`
	}
	app := r.instances()[0]
	if err := workload.Call(ctx, app, adminToken, http.MethodGet, "/api/v1/invariants?stale_after=0s", nil, &inv); err != nil {
		return backlog{}, err
	}
	var ev struct {
		Overview struct {
			Pending   int64 `json:"pending"`
			Sent      int64 `json:"sent"`
			Consumers []struct {
				Applied int64 `json:"applied"`
			} `json:"consumers"`
		} `json:"overview"`
	}
	if err := workload.Call(ctx, app, adminToken, http.MethodGet, "/api/v1/events", nil, &ev); err != nil {
		return backlog{}, err
	}
	ops := inv.Counts.OperationsByStatus
	b := backlog{
		live:    ops["IN_PROGRESS"] + ops["RECOVERING"],
		waiting: ops["NEEDS_RECONCILIATION"],
		keys:    inv.Counts.KeysInProgress,
		pending: ev.Overview.Pending,
	}
	if b.waiting > 0 {
		// The list shows the 100 longest waiting: below that it is all of
		// them, and those with no next question are left to a person.
		var waiting struct {
			Items []struct {
				NextAttemptAt *time.Time `json:"next_attempt_at"`
			} `json:"items"`
		}
		if err := workload.Call(ctx, app, adminToken, http.MethodGet, "/api/v1/admin/reconciliation", nil, &waiting); err != nil {
			return backlog{}, err
		}
		b.unsorted = int64(len(waiting.Items)) < b.waiting
		if !b.unsorted {
			for _, w := range waiting.Items {
				if w.NextAttemptAt == nil {
					b.waiting--
					b.decided++
				}
			}
		}
	}
	for _, c := range ev.Overview.Consumers {
		b.unapplied += max(ev.Overview.Sent-c.Applied, 0)
	}
	return b, nil
}

// waitQuiet waits until the backlog is empty. With every fault healed an
// operation in reconciliation is one whose truth recovery can now learn
// (it re-asks them), and an event not yet applied is one the relay or a
// consumer will still deliver: the drain waits for those too, and the
// checks report whatever is left at the deadline.
func (r *chaosRun) waitQuiet(ctx context.Context, deadline time.Time) error {
	for {
		b, err := r.readBacklog(ctx)
		if err == nil && b.empty() {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("the drain timed out: %w", err)
			}
			return fmt.Errorf("the drain timed out: %s", b)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
