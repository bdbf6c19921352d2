package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
)

// fault is the JSON of a fake's PUT /v1/faults (docs/provider.md): the
// global setting, fields left out taking the fake's defaults.
type fault struct {
	Mode       string `json:"mode"`
	Idempotent bool   `json:"idempotent"`
	SlowMS     int    `json:"slow_ms,omitempty"`
	StatusMode string `json:"status_mode"`
	Seed       int64  `json:"seed,omitempty"`
}

func healthy() fault { return fault{Mode: "ok", Idempotent: true, StatusMode: "ok"} }

// modes are the fault modes a flip draws from, with their weights: mostly
// the three timeouts that look alike to the app (drop, lost_response,
// slow) and their mixture, flaky.
var modes = []struct {
	mode   string
	weight int
}{{"ok", 3}, {"lost_response", 2}, {"drop", 1}, {"error", 1}, {"slow", 1}, {"flaky", 2}, {"reject", 1}}

// flip sets a new global fault at a fake: a mode, whether it is idempotent
// (not, NotIdempotentShare of the time) and whether its status queries
// fail (one time in five).
func (n *Nemesis) flip(ctx context.Context, rng *rand.Rand) {
	if len(n.t.Fakes) == 0 {
		return
	}
	f := n.t.Fakes[rng.IntN(len(n.t.Fakes))]
	total := 0
	for _, m := range modes {
		total += m.weight
	}
	x := rng.IntN(total)
	var ft fault
	for _, m := range modes {
		if x < m.weight {
			ft.Mode = m.mode
			break
		}
		x -= m.weight
	}
	// A fake the app cannot be told about stays idempotent: a double
	// effect there would be the harness's doing.
	ft.Idempotent = rng.Float64() >= n.cfg.NotIdempotentShare || (!n.beliefAtRun && f.IdempotentEnv == "")
	ft.StatusMode = "ok"
	switch rng.IntN(10) {
	case 0:
		ft.StatusMode = "error"
	case 1:
		ft.StatusMode = "drop"
	}
	ft.SlowMS = 500 + rng.IntN(2500)
	ft.Seed = rng.Int64N(1 << 30)
	n.actions.Add(1)
	defer n.actions.Done()
	n.setIdempotent(ctx, f, ft, ft.Idempotent, history.Flip)
}

// setIdempotent applies a fault setting at a fake, keeping the app's belief
// on the safe side of the truth throughout: before a fake stops being
// idempotent the app is told it is not; only after it is idempotent again
// is the app told so. A blind retry is then never sent to a fake that
// would apply it twice because of the harness.
//
// kind is how the change is recorded: a Flip, or part of the Heal (which
// records itself as a whole).
func (n *Nemesis) setIdempotent(ctx context.Context, f Fake, ft fault, idempotent bool, kind string) error {
	n.beliefChange.Lock()
	defer n.beliefChange.Unlock()
	n.mu.Lock()
	was := n.idempotent[f.Name]
	n.mu.Unlock()

	if was && !idempotent {
		if err := n.tellApp(ctx, f, false); err != nil {
			return err
		}
	}
	start := time.Now()
	if err := retry(ctx, 10*time.Second, func() error { return n.app.setFaults(ctx, f.Process.URL(), ft) }); err != nil {
		n.log.Note(fmt.Sprintf("%s: could not set fault %s: %v", f.Name, ft.Mode, err))
		return err
	}
	n.mu.Lock()
	n.idempotent[f.Name] = idempotent
	n.mu.Unlock()
	if kind == history.Flip {
		n.log.Injected(history.Fault{Kind: history.Flip, Target: f.Name, Start: start,
			Detail: fmt.Sprintf("%s idempotent=%t status=%s", ft.Mode, ft.Idempotent, ft.StatusMode)})
	}
	if !was && idempotent {
		return n.tellApp(ctx, f, true)
	}
	return nil
}

// tellApp sets the app's belief about a fake's idempotency: at run time
// through PUT /api/v1/admin/systems/{name}, or — where the app has no such
// endpoint — by restarting both instances with the variable that seeds it.
func (n *Nemesis) tellApp(ctx context.Context, f Fake, idempotent bool) error {
	start := time.Now()
	if n.beliefAtRun {
		err := retry(ctx, 10*time.Second, func() error {
			var errs []error
			for _, app := range n.t.Apps {
				err := n.app.setBelief(ctx, app.URL(), f.Name, idempotent)
				if err == nil {
					return nil
				}
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		})
		if err != nil {
			n.log.Note(fmt.Sprintf("could not tell the app that %s is idempotent=%t: %v", f.Name, idempotent, err))
			return err
		}
		n.believed(f, idempotent)
		n.log.Injected(history.Fault{Kind: history.Belief, Target: f.Name, Start: start, Detail: fmt.Sprintf("believed_idempotent=%t", idempotent)})
		return nil
	}
	// Both instances at once, so that no instance with the old belief
	// survives the change; the clients ride it out on retries.
	n.mu.Lock()
	for _, app := range n.t.Apps {
		n.busy[app.Name()] = true
	}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		for _, app := range n.t.Apps {
			delete(n.busy, app.Name())
		}
		n.mu.Unlock()
	}()
	for _, app := range n.t.Apps {
		app.SetEnv(fmt.Sprintf("%s=%t", f.IdempotentEnv, idempotent))
		app.Restart(300 * time.Millisecond)
	}
	for _, app := range n.t.Apps {
		if err := app.WaitReady(ctx, time.Minute); err != nil {
			return fmt.Errorf("nemesis: %s after a belief restart: %w", app.Name(), err)
		}
	}
	n.believed(f, idempotent)
	n.log.Injected(history.Fault{Kind: history.Belief, Target: f.Name, Start: start, End: time.Now(),
		Detail: fmt.Sprintf("restarted both instances with %s=%t", f.IdempotentEnv, idempotent)})
	return nil
}

func (n *Nemesis) believed(f Fake, idempotent bool) {
	n.mu.Lock()
	n.belief[f.Name] = idempotent
	n.mu.Unlock()
}

// retry calls fn until it succeeds or within passes.
func retry(ctx context.Context, within time.Duration, fn func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
