package labs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/pause"
)

// Lab 7: compensation on a timeout. A deposit booking holds a slot, charges
// the deposit, then confirms. When the charge times out, its outcome is
// unknown — it may have been taken. Compensating at once, as if the timeout
// were a refusal, undoes the wrong thing half the time: it releases a slot
// that was paid for, or refunds a charge that never happened. Asking the
// system first, and trusting NOT_STARTED only after the call's deadline,
// compensates exactly the bookings that were not charged.
//
// Built on the labs' own payments-shaped system rather than on the deposit
// saga (internal/slots/deposit.go), so that the three strategies meet the
// same schedule side by side: they are small functions here, the charge and
// refund real calls over HTTP. The saga follows the "ask first" strategy.
var compensationLab = &Lab{
	Number: 7,
	Name:   "compensation",
	Title:  "Compensate on timeout vs ask first",
	Summary: "Two deposit charges that time out, under three strategies: compensate after the timeout, compensate " +
		"before, and ask the payments service first.",
	Lesson: "Two deposit bookings each hold a slot and charge a deposit, and both charges time out: the first was " +
		"taken and its answer lost (lost_response), the second never got in (drop). Three strategies meet the same " +
		"schedule. Compensate after: treat the timeout as a failure and release the slot — the first booking's " +
		"customer has paid for a slot that is gone. Compensate before: undo everything, refund and release — the " +
		"second booking is refunded a charge that never happened. Ask first: query the charge's status; COMPLETED " +
		"confirms the booking, and NOT_STARTED, once the call's deadline has passed, releases it with nothing to " +
		"refund. Compensation is for a definite refusal or a conclusive NOT_STARTED, never for a timer.",
	Columns: []Column{
		{Key: "executions", Label: "bookings"},
		{Key: "charged", Label: "charges taken"},
		{Key: "confirmed", Label: "confirmed"},
		{Key: "released", Label: "released"},
		{Key: "paid_released", Label: "paid but released", Bad: true},
		{Key: "phantom_refunds", Label: "refunds of no charge", Bad: true},
	},
	Code: []CodeRef{
		{Path: "internal/labs/compensation.go", Text: "func (b *deposit) brokenCompensateAfterTimeout(ctx context.Context) error {",
			Says: "brokenCompensateAfterTimeout: a timeout taken for a refusal"},
		{Path: "internal/labs/compensation.go", Text: "func (b *deposit) brokenRefundThenRelease(ctx context.Context) error {",
			Says: "brokenRefundThenRelease: a refund sent for a charge nobody knows happened"},
		{Path: "internal/labs/compensation.go", Text: "if !pause.For(ctx, time.Until(b.deadline.Add(compensationMargin))) {",
			Says: "ask the truth; act on COMPLETED, or on NOT_STARTED once the deadline has passed"},
		{Path: "internal/workflow/recover.go", Text: "func (a *attempt) untilConclusive(ctx context.Context, i int) (time.Duration, error) {",
			Says: "the engine's deadline rule, the same one"},
		{Path: "internal/slots/deposit.go", Text: "{Name: StepChargeDeposit, Call: chargeDeposit{pay}, Refused: workflow.FailOperation, Abandon: holdTimeIsUp},",
			Says: "the real deposit saga: only a refusal fails the charge and undoes the hold; NOT_STARTED, once conclusive, asks whether the hold's time is up"},
		{Path: "internal/slots/deposit.go", Text: "func (d *Deposits) releaseHold(ctx context.Context, tx pgx.Tx, op workflow.Operation) (string, error) {",
			Says: "the real compensation, run only in the transaction that records the charge FAILED"},
		{Path: "internal/workflow/recover.go", Text: "func (a *attempt) notStarted(ctx context.Context, i int, why string) (recovery.Result, error) {",
			Says: "where a conclusive NOT_STARTED becomes the same call again, or the step given up"},
		{Path: "internal/slots/deposit_steps.go", Text: "func (refundDeposit) Request(ctx context.Context, tx pgx.Tx, op workflow.Operation) (any, error) {",
			Says: "the reverse saga's refund names a charge step DONE: no refund of a charge nobody knows happened"},
	},
	run: runCompensation,
}

// The three strategies.
const (
	compensateAfter  = "compensate-after"
	compensateBefore = "compensate-before"
	askFirst         = "ask-first"
)

const (
	chargeTimeout      = 300 * time.Millisecond
	compensationMargin = 200 * time.Millisecond
)

func runCompensation(ctx context.Context, e *env) ([]Variant, error) {
	sys, err := e.system(systemLabs)
	if err != nil {
		return nil, err
	}
	strategies := []struct{ name, title string }{
		{compensateAfter, "Compensate after: release the slot on the timeout"},
		{compensateBefore, "Compensate before: refund and release on the timeout"},
		{askFirst, "Ask first: the charge's status, then act on the truth"},
	}
	out := make([]Variant, len(strategies))
	errs := make([]error, len(strategies))
	var wg sync.WaitGroup
	for i, p := range strategies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = e.depositBookings(ctx, sys, p.name)
			out[i].Title = p.title
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// depositBookings runs the schedule — booking 1's charge applied and its
// answer lost, booking 2's charge dropped — under one strategy.
func (e *env) depositBookings(ctx context.Context, sys *fakeSystem, strategy string) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: strategy, Broken: strategy != askFirst, Counts: map[string]int{}}
	schedule := []fault.Mode{fault.ModeLostResponse, fault.ModeDrop}
	// One booking after the other, so the timeline reads the same every run.
	for i, mode := range schedule {
		subject, err := e.subject(ctx)
		if err != nil {
			return v, err
		}
		if err := sys.schedule(ctx, subject, faultOf(mode, true)); err != nil {
			return v, err
		}
		if err := e.depositBooking(ctx, t, sys, strategy, fmt.Sprintf("booking %d", i+1), subject); err != nil {
			return v, err
		}
	}
	return e.tallyDeposits(ctx, t, v, strategy)
}

// depositBooking holds a slot, charges the deposit and, the charge having
// timed out, does what strategy says.
func (e *env) depositBooking(ctx context.Context, t *timeline, sys *fakeSystem, strategy, who string, subject int64) error {
	var id int64
	if err := e.lab.QueryRow(ctx, `
		INSERT INTO deposit_bookings (run_id, variant, subject_id)
		VALUES ($1, $2, $3)
		RETURNING id`, e.run, strategy, subject).Scan(&id); err != nil {
		return err
	}
	t.say(who, "held the slot")
	client := sys.client(chargeTimeout)
	chargeKey := e.name("compensation", strategy, fmt.Sprint(id)) + ":charge_deposit"
	deadline := client.Deadline()
	res, err := client.Send(ctx, external.Call{Path: callsPath, Key: chargeKey, Deadline: deadline,
		Body: callBody{SubjectID: subject, What: "charge"}})
	if err != nil {
		return err
	}
	if res.Outcome != external.Unknown {
		return fmt.Errorf("%s: the charge was answered (%v); the schedule says it times out", who, res.Outcome)
	}
	t.say(who, "charging the deposit timed out: its outcome is unknown")

	b := &deposit{e: e, t: t, id: id, who: who, subject: subject, client: client, chargeKey: chargeKey, deadline: deadline}
	switch strategy {
	case compensateAfter:
		return b.brokenCompensateAfterTimeout(ctx)
	case compensateBefore:
		return b.brokenRefundThenRelease(ctx)
	case askFirst:
		return b.askFirst(ctx)
	}
	return fmt.Errorf("no strategy %q", strategy)
}

// deposit is one booking whose deposit charge timed out.
type deposit struct {
	e         *env
	t         *timeline
	id        int64
	who       string
	subject   int64
	client    *external.Client
	chargeKey string
	deadline  time.Time // the charge's Request-Deadline
}

// brokenCompensateAfterTimeout takes the timeout for a refusal and
// releases the slot, whether or not the deposit was taken.
func (b *deposit) brokenCompensateAfterTimeout(ctx context.Context) error {
	return b.release(ctx, "compensation on the timeout")
}

// brokenRefundThenRelease undoes everything on the timeout: it refunds the
// deposit in case it was charged, then releases the slot.
func (b *deposit) brokenRefundThenRelease(ctx context.Context) error {
	refund, err := b.client.Send(ctx, external.Call{Path: callsPath, Key: b.chargeKey + ":refund",
		Body: callBody{SubjectID: b.subject, What: "refund"}})
	if err != nil || refund.Outcome != external.Confirmed {
		return fmt.Errorf("%s: refund: %v %v", b.who, refund.Err, err)
	}
	b.t.say(b.who, "refunded the deposit, in case it was charged")
	return b.release(ctx, "compensation on the timeout")
}

// askFirst asks for the charge's truth and acts on it: COMPLETED confirms;
// NOT_STARTED releases, but only once the charge's deadline (plus the skew
// margin) has passed, since before it the call may still be on its way.
func (b *deposit) askFirst(ctx context.Context) error {
	truth, err := b.client.Status(ctx, callsPath, b.chargeKey)
	if err != nil {
		return err
	}
	if truth == external.TruthNotStarted {
		b.t.say(b.who, "the charge's status: NOT_STARTED — not conclusive before its deadline plus %s", compensationMargin)
		if !pause.For(ctx, time.Until(b.deadline.Add(compensationMargin))) {
			return ctx.Err()
		}
		if truth, err = b.client.Status(ctx, callsPath, b.chargeKey); err != nil {
			return err
		}
	}
	b.t.say(b.who, "the charge's status: %s", truth)
	switch truth {
	case external.TruthCompleted:
		_, err := b.e.lab.Exec(ctx, `
			UPDATE deposit_bookings
			   SET status = 'CONFIRMED'
			 WHERE id = $1
			   AND status = 'HELD' -- only a hold is confirmed`, b.id)
		if err == nil {
			b.t.say(b.who, "confirmed: the deposit was paid")
		}
		return err
	case external.TruthNotStarted:
		return b.release(ctx, "the charge conclusively never happened")
	}
	return fmt.Errorf("%s: the charge's status stayed %s", b.who, truth)
}

func (b *deposit) release(ctx context.Context, why string) error {
	_, err := b.e.lab.Exec(ctx, `
		UPDATE deposit_bookings
		   SET status = 'RELEASED'
		 WHERE id = $1
		   AND status = 'HELD' -- only a hold is released`, b.id)
	if err == nil {
		b.t.say(b.who, "released the slot (%s)", why)
	}
	return err
}

// tallyDeposits compares each booking's fate with what the system did.
func (e *env) tallyDeposits(ctx context.Context, t *timeline, v Variant, strategy string) (Variant, error) {
	rows, err := e.lab.Query(ctx, `
		SELECT b.status,
		       count(*) FILTER (WHERE f.what = 'charge'),
		       count(*) FILTER (WHERE f.what = 'refund')
		  FROM deposit_bookings b
		  LEFT JOIN fake_effects f ON f.subject_id = b.subject_id
		 WHERE b.run_id = $1
		   AND b.variant = $2
		 GROUP BY b.id, b.status
		 ORDER BY b.id`, e.run, strategy)
	if err != nil {
		return v, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var status string
		var charges, refunds int
		if err := rows.Scan(&status, &charges, &refunds); err != nil {
			return v, err
		}
		n++
		v.Counts["executions"]++
		v.Counts["charged"] += charges
		switch status {
		case "CONFIRMED":
			v.Counts["confirmed"]++
		case "RELEASED":
			v.Counts["released"]++
		}
		if status == "RELEASED" && charges > refunds {
			v.Counts["paid_released"]++
			t.wrong("result", "booking %d: the deposit was taken and the slot released", n)
		}
		if refunds > charges {
			v.Counts["phantom_refunds"] += refunds - charges
			t.wrong("result", "booking %d: refunded a charge that never happened", n)
		}
	}
	if err := rows.Err(); err != nil {
		return v, err
	}
	v.Verdict = fmt.Sprintf("%d confirmed, %d released; %d paid but released, %s of no charge",
		v.Counts["confirmed"], v.Counts["released"], v.Counts["paid_released"], plural(v.Counts["phantom_refunds"], "refund"))
	v.Timeline = t.list()
	return v, nil
}
