package labs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Lab 11: webhook handlers. The provider calls back at least once, late and
// out of order, while recovery asks the same question. Three handlers each
// leave out one of the gates workflow.Engine.Callback keeps (the inbox, the
// fence of a step in flight, monotonic state), and each breaks its own way;
// the correct one keeps all three. Same schedule for all four.
var callbacksLab = &Lab{
	Number: 11,
	Name:   "webhooks",
	Title:  "Webhook handlers: inbox, fence, monotonic state",
	Summary: "Three webhook handlers, each leaving out one gate — the inbox, the fence, monotonic state — beside " +
		"the app's handler, which keeps all three.",
	Lesson: "A refund follows once the provider's step is settled. Recovery asks the provider, hears COMPLETED and " +
		"settles the step (one refund). Then the provider's callback arrives — COMPLETED, event e1 — and again (the " +
		"sender's first push lost its answer, so it pushes e1 once more), and last a RUNNING, e0, that was sent " +
		"before the COMPLETED but arrives after it. Applied blindly, every COMPLETED refunds again and the late " +
		"RUNNING moves the step back. Deduplicated by event id but not fenced, e1 still refunds a second time: the " +
		"inbox cannot know that recovery settled the step by asking. Fenced but not monotonic, the late RUNNING " +
		"overwrites DONE. The app's handler (workflow.Engine.Callback) keeps the inbox, changes a step only while it " +
		"is in flight, and never moves it back: one refund, the step DONE.",
	RunHint: "All four handlers run on the server, on the lab's own data, with the same schedule.",
	Columns: []Column{
		{Key: "deliveries", Label: "callbacks delivered"},
		{Key: "effects", Label: "refunds made"},
		colDuplicates,
		{Key: "backwards", Label: "steps moved backwards", Bad: true},
		{Key: "refused", Label: "changed nothing"},
	},
	Code: []CodeRef{
		{Path: "internal/workflow/callback.go", Text: "ON CONFLICT (system, event_id) DO NOTHING -- received before: that copy had the effect`,",
			Says: "the inbox: one effect per event id, in the effect's transaction"},
		{Path: "internal/workflow/callback.go", Text: "inFlight := rec.State == StepSent || rec.State == StepUnknown",
			Says: "monotonic: only a step in flight learns an outcome; DONE is never moved"},
		{Path: "internal/workflow/callback.go", Text: "if next, err = r.learnTruth(ctx, tx, i, cb.Truth, reason, said, r.handOver); err != nil {",
			Says: "the fence: the same fenced step write recovery uses"},
	},
	run: runCallbacks,
}

// callbackHandler handles one callback in tx: it reports whether it changed
// anything.
type callbackHandler func(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error)

type labCallback struct {
	run            int64
	variant, event string
	status         string // COMPLETED, RUNNING
}

func runCallbacks(ctx context.Context, e *env) ([]Variant, error) {
	variants := []struct {
		name, title string
		handle      callbackHandler
	}{
		{"blind", "Apply blindly", applyBlindly},
		{"no-fence", "Dedupe by event id, no fence", dedupeNoFence},
		{"no-monotonic", "Dedupe and fence, state not monotonic", fenceNotMonotonic},
		{"correct", "Inbox, fence, monotonic (workflow.Engine.Callback)", applyCorrectly},
	}
	var out []Variant
	for _, v := range variants {
		res, err := e.callbacks(ctx, v.name, v.handle)
		if err != nil {
			return nil, err
		}
		res.Title = v.title
		out = append(out, res)
	}
	return out, nil
}

// callbacks runs the schedule against one handler.
func (e *env) callbacks(ctx context.Context, variant string, handle callbackHandler) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant != "correct", Counts: map[string]int{}}
	if _, err := e.lab.Exec(ctx, `INSERT INTO callback_steps (run_id, variant, state) VALUES ($1, $2, 'SENT')`, e.run, variant); err != nil {
		return v, fmt.Errorf("labs: callbacks: %w", err)
	}
	t.say("request", "provider_cancel SENT; its answer is lost: the outcome is unknown")
	// Recovery's fenced write, the same in every variant: the step settles
	// only while it is in flight, and the refund comes with it.
	var settled bool
	err := pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
		var err error
		settled, err = settle(ctx, tx, labCallback{run: e.run, variant: variant, event: "recovery"})
		return err
	})
	if err != nil {
		return v, err
	}
	t.say("recovery", "asked the provider: COMPLETED — step DONE, refund made (settled=%t)", settled)
	for _, c := range []struct{ event, status, why string }{
		{"e1", "COMPLETED", "the callback"},
		{"e1", "COMPLETED", "the same event again: the sender's first push lost its answer"},
		{"e0", "RUNNING", "sent before the COMPLETED, arrives after it"},
	} {
		v.Counts["deliveries"]++
		var changed bool
		err := pgx.BeginFunc(ctx, e.lab, func(tx pgx.Tx) error {
			var err error
			changed, err = handle(ctx, tx, labCallback{run: e.run, variant: variant, event: c.event, status: c.status})
			return err
		})
		if err != nil {
			return v, err
		}
		if !changed {
			v.Counts["refused"]++
			t.say("handler", "%s %s (%s): changed nothing", c.event, c.status, c.why)
		} else {
			t.say("handler", "%s %s (%s): applied", c.event, c.status, c.why)
		}
	}
	var state string
	var effects int
	err = e.lab.QueryRow(ctx, `
		SELECT s.state, (SELECT count(*) FROM callback_effects f WHERE f.run_id = s.run_id AND f.variant = s.variant)
		  FROM callback_steps s
		 WHERE s.run_id = $1
		   AND s.variant = $2`, e.run, variant).Scan(&state, &effects)
	if err != nil {
		return v, fmt.Errorf("labs: callbacks: %w", err)
	}
	v.Counts["effects"] = effects
	if effects > 1 {
		v.Counts["duplicates"] = effects - 1
		t.wrong("result", "%s for one cancellation", plural(effects, "refund"))
	}
	if state != "DONE" {
		v.Counts["backwards"] = 1
		t.wrong("result", "the step ends %s after it was DONE: recovery will ask again, and a person may be told it never finished", state)
	}
	v.Verdict = fmt.Sprintf("%s, the step ends %s", plural(effects, "refund"), state)
	v.Timeline = t.list()
	return v, nil
}

// settle is the fenced write: DONE only from in flight, and the refund in
// the same transaction when (and only when) it changed the step.
func settle(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	tag, err := tx.Exec(ctx, `
		UPDATE callback_steps
		   SET state = 'DONE'
		 WHERE run_id = $1
		   AND variant = $2
		   AND state IN ('SENT', 'RUNNING') -- 0 rows: its outcome is known already`, c.run, c.variant)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	return true, refund(ctx, tx, c)
}

func refund(ctx context.Context, tx pgx.Tx, c labCallback) error {
	_, err := tx.Exec(ctx, `INSERT INTO callback_effects (run_id, variant, by) VALUES ($1, $2, $3)`, c.run, c.variant, c.event)
	return err
}

// firstTime records the event in the inbox: false for a copy.
func firstTime(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	tag, err := tx.Exec(ctx, `
		INSERT INTO callback_inbox (run_id, variant, event_id)
		VALUES ($1, $2, $3)
		ON CONFLICT DO NOTHING`, c.run, c.variant, c.event)
	return err == nil && tag.RowsAffected() == 1, err
}

var errUnknownStatus = errors.New("labs: unknown callback status")

// applyBlindly sets the state the callback says and refunds on COMPLETED.
func applyBlindly(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	if _, err := tx.Exec(ctx, `
		UPDATE callback_steps
		   SET state = CASE $3 WHEN 'COMPLETED' THEN 'DONE' ELSE $3 END -- whatever it says, whatever the step is
		 WHERE run_id = $1
		   AND variant = $2`, c.run, c.variant, c.status); err != nil {
		return false, err
	}
	if c.status == "COMPLETED" {
		return true, refund(ctx, tx, c)
	}
	return true, nil
}

// dedupeNoFence keeps an inbox and never lowers the state, but refunds on
// every new COMPLETED event, whether or not the step was still in flight.
func dedupeNoFence(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	if first, err := firstTime(ctx, tx, c); err != nil || !first {
		return false, err
	}
	if c.status != "COMPLETED" {
		return false, nil // RUNNING settles nothing
	}
	if _, err := tx.Exec(ctx, `
		UPDATE callback_steps
		   SET state = 'DONE' -- no "AND state IN ('SENT', 'RUNNING')": nothing tells it recovery settled it
		 WHERE run_id = $1
		   AND variant = $2`, c.run, c.variant); err != nil {
		return false, err
	}
	return true, refund(ctx, tx, c)
}

// fenceNotMonotonic keeps an inbox and settles only a step in flight, but
// writes RUNNING whatever the step is.
func fenceNotMonotonic(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	if first, err := firstTime(ctx, tx, c); err != nil || !first {
		return false, err
	}
	switch c.status {
	case "COMPLETED":
		return settle(ctx, tx, c)
	case "RUNNING":
		_, err := tx.Exec(ctx, `
			UPDATE callback_steps
			   SET state = 'RUNNING' -- over DONE too: the late RUNNING wins
			 WHERE run_id = $1
			   AND variant = $2`, c.run, c.variant)
		return err == nil, err
	}
	return false, errUnknownStatus
}

// applyCorrectly is Engine.Callback's gates: the inbox, then the fenced
// write of a step in flight; RUNNING settles nothing and never moves it.
func applyCorrectly(ctx context.Context, tx pgx.Tx, c labCallback) (bool, error) {
	if first, err := firstTime(ctx, tx, c); err != nil || !first {
		return false, err
	}
	if c.status != "COMPLETED" {
		return false, nil
	}
	return settle(ctx, tx, c)
}
