package labs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/pause"
)

// Lab 9: a status answer describes the past. NOT_STARTED says no call with
// the key had arrived when the system answered — not that none is on its
// way. A call held in the network past its caller's timeout arrives later
// and takes effect. The deadline every call carries closes the gap: the
// system refuses a call that arrives after it, and the caller trusts
// NOT_STARTED only once that deadline (plus a margin) has passed.
var statusLab = &Lab{
	Number: 9,
	Name:   "status",
	Title:  "A status answer is not proof",
	Summary: "A NOT_STARTED read while the first call is still in the network is not proof: a retry without a " +
		"deadline is applied twice, one with Request-Deadline once.",
	Lesson: "The first call is held in the network (a netfault proxy between the app and the system) for 1.5 s, " +
		"well past the caller's 300 ms timeout. The caller asks for the key's status: NOT_STARTED — true, the call " +
		"has not arrived. The broken caller, whose calls carry no deadline, takes that as proof and retries at " +
		"once; the system is not idempotent, and when the original finally lands it is applied as well: the policy " +
		"is cancelled twice. The correct caller sends Request-Deadline with every call and trusts NOT_STARTED only " +
		"after that deadline plus a margin for clock skew; its retry is applied, and the original, landing after " +
		"its deadline, is refused by the system (408 deadline_passed, nothing applied): once. Both runs share the " +
		"one scheduled delay.",
	Columns: []Column{
		{Key: "executions", Label: "calls arrived"},
		colEffects, colDuplicates,
		{Key: "refused", Label: "late arrivals refused"},
	},
	Code: []CodeRef{
		{Path: "internal/fault/store.go", Text: "WHERE now() > $4",
			Says: "the system refuses, durably, a call that arrives after its deadline"},
		{Path: "internal/workflow/recover.go", Text: "func (a *attempt) untilConclusive(ctx context.Context, i int) (time.Duration, error) {",
			Says: "recovery trusts NOT_STARTED only after every attempt's deadline plus the skew margin"},
		{Path: "internal/labs/status.go", Text: "func brokenSendWithoutDeadline(ctx context.Context, url, key string, body any, timeout time.Duration) (int, error) {",
			Says: "brokenSendWithoutDeadline: a call that may be applied whenever it arrives"},
	},
	run: runStatus,
}

// The schedule of the status lab, the same for both variants.
const (
	statusTimeout = 300 * time.Millisecond  // the caller's patience
	statusHold    = 1500 * time.Millisecond // how long the network holds the first call
	statusMargin  = 200 * time.Millisecond  // the clock-skew margin on the deadline
	// statusAsk is the patience for a status question and for the retry:
	// the schedule is the first call's (its 300 ms against the 1.5 s hold),
	// and a question or a retry that times out on a loaded machine would
	// only end the run, not change what it shows. The retry is not held;
	// the correct caller's carries a deadline this far off, which the
	// original's, long passed, does not share.
	statusAsk = 10 * time.Second
)

func runStatus(ctx context.Context, e *env) ([]Variant, error) {
	sys, err := e.system(systemLabs)
	if err != nil {
		return nil, err
	}
	proxy, err := netfault.Listen(sys.url[len("http://"):], netfault.Options{})
	if err != nil {
		return nil, err
	}
	defer proxy.Close()

	type side struct {
		name    string
		subject int64
		key     string
	}
	sides := []side{{name: "broken"}, {name: "correct"}}
	for i := range sides {
		s := &sides[i]
		if s.subject, err = e.subject(ctx); err != nil {
			return nil, err
		}
		s.key = e.name("status", s.name) + ":provider_cancel"
		// Not idempotent: a repeat of the key is applied again.
		if _, err := sys.SetFaults(ctx, subjectFault(s.subject, faultOf(fault.ModeOK, false))); err != nil {
			return nil, err
		}
		// The one scheduled delay: the first call with this key is held.
		proxy.HoldNext(1, statusHold, "Idempotency-Key: "+s.key)
	}

	out := make([]Variant, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range sides {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.name == "broken" {
				out[i], errs[i] = e.retryOnNotStarted(ctx, sys, proxy.URL(), s.subject, s.key)
			} else {
				out[i], errs[i] = e.retryAfterDeadline(ctx, sys, proxy.URL(), s.subject, s.key)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out[0].Title = "No deadline; retry as soon as the status says NOT_STARTED"
	out[1].Title = "Request-Deadline on every call; NOT_STARTED trusted only after it"
	return out, nil
}

func subjectFault(subject int64, f fault.Fault) fault.Fault {
	f.PolicyID = &subject
	return f
}

// retryOnNotStarted is the broken caller.
func (e *env) retryOnNotStarted(ctx context.Context, sys *fakeSystem, url string, subject int64, key string) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: "broken", Broken: true, Counts: map[string]int{}}
	body := callBody{SubjectID: subject, What: "cancel"}
	status := external.NewClient("lab system", url, statusAsk)

	t.say("caller", "sends the cancellation (key %s), without a deadline", key)
	if code, err := brokenSendWithoutDeadline(ctx, url, key, body, statusTimeout); err == nil {
		return v, fmt.Errorf("the held call was answered %d", code)
	}
	t.say("caller", "timed out after %s; the call is still held in the network", statusTimeout)
	truth, err := status.Status(ctx, callsPath, key)
	if err != nil {
		return v, err
	}
	t.say("caller", "asks the status: %s", truth)
	if truth != external.TruthNotStarted {
		return v, fmt.Errorf("the schedule did not hold: the status said %s before the held call arrived", truth)
	}
	t.wrong("caller", "takes NOT_STARTED as proof and retries at once, same key")
	if code, err := brokenSendWithoutDeadline(ctx, url, key, body, statusAsk); err != nil || code != http.StatusOK {
		return v, fmt.Errorf("the retry: %d %v", code, err)
	}
	t.say("system", "applied the retry")
	if err := e.waitForOriginal(ctx, t, key, 2, 0); err != nil {
		return v, err
	}
	t.wrong("system", "the original call arrived at last, without a deadline, and was applied too (the system is not idempotent)")
	return e.tallyStatus(ctx, t, v, subject, key)
}

// retryAfterDeadline is the correct caller: the deadline rule.
func (e *env) retryAfterDeadline(ctx context.Context, sys *fakeSystem, url string, subject int64, key string) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: "correct", Counts: map[string]int{}}
	body := callBody{SubjectID: subject, What: "cancel"}
	client := external.NewClient("lab system", url, statusTimeout)
	asker := external.NewClient("lab system", url, statusAsk)

	deadline := client.Deadline()
	t.say("caller", "sends the cancellation (key %s) with Request-Deadline %s", key, deadline.UTC().Format("15:04:05.000"))
	res, err := client.Send(ctx, external.Call{Path: callsPath, Key: key, Body: body, Deadline: deadline})
	if err != nil {
		return v, err
	}
	if res.Outcome != external.Unknown {
		return v, fmt.Errorf("the held call was answered: %v", res.Outcome)
	}
	t.say("caller", "timed out; the outcome is unknown and the call still held in the network")
	truth, err := asker.Status(ctx, callsPath, key)
	if err != nil {
		return v, err
	}
	t.say("caller", "asks the status: %s — not conclusive before the deadline plus %s", truth, statusMargin)
	if !pause.For(ctx, time.Until(deadline.Add(statusMargin))) {
		return v, ctx.Err()
	}
	if truth, err = asker.Status(ctx, callsPath, key); err != nil {
		return v, err
	}
	if truth != external.TruthNotStarted {
		return v, fmt.Errorf("the schedule did not hold: the status said %s after the deadline", truth)
	}
	t.say("caller", "the deadline has passed and the status still says %s: conclusive — retries, same key, new deadline", truth)
	res, err = asker.Send(ctx, external.Call{Path: callsPath, Key: key, Body: body})
	if err != nil || res.Outcome != external.Confirmed {
		return v, fmt.Errorf("the retry: %v %v", res.Err, err)
	}
	t.say("system", "applied the retry")
	if err := e.waitForOriginal(ctx, t, key, 1, 1); err != nil {
		return v, err
	}
	t.say("system", "the original call arrived after its deadline: refused (408 deadline_passed), nothing applied")
	return e.tallyStatus(ctx, t, v, subject, key)
}

// waitForOriginal waits until the held call has reached the system: the
// proxy delivers it after statusHold, however long the caller waited.
func (e *env) waitForOriginal(ctx context.Context, t *timeline, key string, processed, late int) error {
	return waitFor(ctx, statusHold+10*time.Second, func() (bool, error) {
		p, l, err := e.arrivals(ctx, systemLabs, key)
		return p >= processed && l >= late, err
	})
}

func (e *env) tallyStatus(ctx context.Context, t *timeline, v Variant, subject int64, key string) (Variant, error) {
	processed, late, err := e.arrivals(ctx, systemLabs, key)
	if err != nil {
		return v, err
	}
	effects, err := e.effectsOf(ctx, subject, "")
	if err != nil {
		return v, err
	}
	v.Counts["executions"] = processed + late
	v.Counts["effects"] = effects
	v.Counts["duplicates"] = max(0, effects-1)
	v.Counts["refused"] = late
	v.Verdict = "the policy was cancelled " + plural(effects, "time")
	v.Timeline = t.list()
	return v, nil
}

// brokenSendWithoutDeadline sends a call with no Request-Deadline: the
// system has no way to tell an on-time call from one that wandered the
// network for a minute, and applies it whenever it arrives.
func brokenSendWithoutDeadline(ctx context.Context, url, key string, body any, timeout time.Duration) (int, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+callsPath, bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
