package labs

import (
	"context"
	"fmt"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/recovery"
)

// Lab 8: what the app believes about a system. Whether a repeated call
// with the same key applies nothing new cannot be learned by trying —
// trying is the double effect — so it is a setting (external_systems), and
// recovery acts on it when the truth cannot be learned. Told the system is
// idempotent when it is not, recovery repeats the call and doubles the
// effect; told the truth, it hands the operation to a person.
var beliefLab = &Lab{
	Number: 8,
	Name:   "belief",
	Title:  "A wrong belief about idempotency",
	Summary: "A system wrongly believed idempotent is sent the same call again and applies it twice; believed as " +
		"it is, recovery hands the operation to a person instead.",
	Lesson: "The lab's system is NOT idempotent: a repeated key is applied again. Its first call's answer is lost " +
		"(the call is applied; the caller times out), and its status queries fail, so the outcome cannot be " +
		"learned. Recovery then decides by what the app believes about the system — the external_systems row, as " +
		"the engine's recovery does. The broken run is told, on purpose and labelled as such, that the system is " +
		"idempotent: recovery sends the same call again and the policy is cancelled twice. The correct run is told " +
		"the truth: recovery does not repeat a call it cannot prove harmless, and hands the operation to a person " +
		"(NEEDS_RECONCILIATION) with one effect.",
	Columns: []Column{
		{Key: "executions", Label: "calls sent"},
		colEffects, colDuplicates,
		{Key: "refused", Label: "handed to a person"},
	},
	Code: []CodeRef{
		{Path: "internal/workflow/recover.go", Text: "if b.Idempotent && a.r.op.CancelRequestedAt == nil { // after a cancel, only asking",
			Says: "the engine repeats an unknown call only on a system believed idempotent"},
		{Path: "internal/workflow/recover.go", Text: "return a.backOff(ctx, i, BranchBackoff, seen+\"; \"+b.Says()+\": calling again could apply it twice, so recovery asks again later\", 0, true)",
			Says: "otherwise it backs off and, out of attempts, a person decides"},
		{Path: "internal/labs/belief.go", Text: "by = \"the wrong-belief lab: deliberately wrong, the system is not idempotent\"",
			Says: "the lab's mismatch of belief and system, labelled where it is set"},
	},
	run: runBelief,
}

const (
	beliefTimeout = 300 * time.Millisecond
	beliefPolls   = 2 // status queries before deciding
)

func runBelief(ctx context.Context, e *env) ([]Variant, error) {
	sys, err := e.system(systemLabsBelief)
	if err != nil {
		return nil, err
	}
	// This system's status queries fail (fake-wide, so the lab has a system
	// of its own); calls are applied and NOT idempotent.
	global := faultOf(fault.ModeOK, false)
	global.StatusMode = fault.StatusError
	if _, err := sys.SetFaults(ctx, global); err != nil {
		return nil, err
	}
	broken, err := e.recoverByBelief(ctx, sys, "broken", true)
	if err != nil {
		return nil, err
	}
	correct, err := e.recoverByBelief(ctx, sys, "correct", false)
	if err != nil {
		return nil, err
	}
	broken.Title = "The app believes the system is idempotent (deliberately wrong)"
	correct.Title = "The app believes the truth: not idempotent"
	return []Variant{broken, correct}, nil
}

// recoverByBelief: one call whose answer is lost, status queries that fail,
// then the recovery decision by the belief.
func (e *env) recoverByBelief(ctx context.Context, sys *fakeSystem, variant string, believed bool) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Broken: variant == "broken", Counts: map[string]int{}}
	system := e.name("belief", variant)
	if _, err := e.lab.Exec(ctx, `
		INSERT INTO external_systems (name, believed_idempotent, updated_by)
		VALUES ($1, true, 'the wrong-belief lab')`, system); err != nil {
		return v, err
	}
	by := "the wrong-belief lab: the truth"
	if believed {
		by = "the wrong-belief lab: deliberately wrong, the system is not idempotent"
	}
	belief, err := recovery.SetBelief(ctx, e.lab, system, believed, by)
	if err != nil {
		return v, err
	}
	t.say("admin", "set the belief: believed_idempotent = %t (%s)", belief.Idempotent, belief.UpdatedBy)

	subject, err := e.subject(ctx)
	if err != nil {
		return v, err
	}
	if err := sys.schedule(ctx, subject, faultOf(fault.ModeLostResponse, false)); err != nil {
		return v, err
	}
	client := sys.client(beliefTimeout)
	key := e.name("belief", variant) + ":provider_cancel"
	call := external.Call{Path: callsPath, Key: key, Body: callBody{SubjectID: subject, What: "cancel"}}
	res, err := client.Send(ctx, call)
	if err != nil {
		return v, err
	}
	v.Counts["executions"]++
	if res.Outcome != external.Unknown {
		return v, fmt.Errorf("the lost answer arrived: %v", res.Outcome)
	}
	t.say("app", "sent %s; no answer within %s: the outcome is unknown", key, beliefTimeout)
	for i := 1; i <= beliefPolls; i++ {
		_, err := client.Status(ctx, callsPath, key)
		if err == nil {
			return v, fmt.Errorf("the status query answered; the schedule says it fails")
		}
		t.say("recovery", "status query %d/%d: the system cannot be asked (503)", i, beliefPolls)
	}
	// The decision, as the engine makes it: read the belief now.
	var idempotent bool
	if err := e.lab.QueryRow(ctx, `
		SELECT believed_idempotent
		  FROM external_systems
		 WHERE name = $1`, system).Scan(&idempotent); err != nil {
		return v, err
	}
	if idempotent {
		t.wrong("recovery", "the app believes the system is idempotent: the same call again, same key")
		res, err := client.Send(ctx, call)
		if err != nil {
			return v, err
		}
		v.Counts["executions"]++
		t.say("system", "answered %s — and, not being idempotent, applied it again", res.Outcome)
	} else {
		v.Counts["refused"]++
		t.say("recovery", "calling again could apply it twice: NEEDS_RECONCILIATION, a person decides")
	}
	effects, err := e.effectsOf(ctx, subject, "")
	if err != nil {
		return v, err
	}
	v.Counts["effects"] = effects
	v.Counts["duplicates"] = max(0, effects-1)
	if effects > 1 {
		t.wrong("system", "the policy was cancelled %d times", effects)
	}
	v.Verdict = fmt.Sprintf("%s; %d handed to a person", plural(effects, "effect"), v.Counts["refused"])
	v.Timeline = t.list()
	return v, nil
}
