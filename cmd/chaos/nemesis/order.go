package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/internal/pause"
)

// callbackModes are the fakes' callback modes a callback flip draws from
// (docs/provider.md, "Callbacks"): every way a real provider's webhooks
// arrive — once, twice, late (after recovery asked), a RUNNING after its
// COMPLETED, or never.
var callbackModes = []string{"ok", "duplicate", "delay", "reorder", "lost"}

// flipCallbacks sets how each fake calls the app back, a mode drawn for
// each, through the fake's own control API (straight to it, not through
// the proxy).
func (n *Nemesis) flipCallbacks(ctx context.Context, rng *rand.Rand) {
	n.actions.Add(1)
	defer n.actions.Done()
	for _, f := range n.t.Fakes {
		mode := callbackModes[rng.IntN(len(callbackModes))]
		delay := 300 + rng.IntN(2700) // past PROVIDER_TIMEOUT and a recovery pass, often
		start := time.Now()
		err := persist(ctx, func() error {
			return n.app.put(ctx, f.Process.URL()+"/v1/webhooks", false, map[string]any{"mode": mode, "delay_ms": delay})
		})
		n.log.Injected(history.Fault{Kind: history.Callbacks, Target: f.Name, Start: start, End: time.Now(),
			Detail: fmt.Sprintf("%s, delay %d ms%s", mode, delay, errSuffix(err))})
	}
}

// reorder arms the events' redelivery injector (PUT
// /api/v1/admin/events/injector, a script in the database every instance
// follows): the next few deliveries to the history consumer are sent back
// unhandled, so one aggregate's later events overtake them — the consumer
// must park them (invariant 10: every history the ordered fold).
func (n *Nemesis) reorder(ctx context.Context, rng *rand.Rand) {
	n.actions.Add(1)
	defer n.actions.Done()
	count := 3 + rng.IntN(10)
	first := rng.IntN(len(n.t.Apps))
	start := time.Now()
	tries := 0
	err := persist(ctx, func() error { // any instance will do: each try asks the next
		app := n.t.Apps[(first+tries)%len(n.t.Apps)]
		tries++
		return n.app.put(ctx, app.URL()+"/api/v1/admin/events/injector", true,
			map[string]any{"mode": "out_of_order", "consumer": "history", "count": count})
	})
	n.log.Injected(history.Fault{Kind: history.Reorder, Target: "history", Start: start, End: time.Now(),
		Detail: fmt.Sprintf("the next %d deliveries sent back%s", count, errSuffix(err))})
}

// clearReorder empties the injector's script at heal.
func (n *Nemesis) clearReorder(ctx context.Context) {
	for _, app := range n.t.Apps {
		if n.app.put(ctx, app.URL()+"/api/v1/admin/events/injector", true, map[string]any{"mode": ""}) == nil {
			return
		}
	}
}

// persist tries set for up to 5 s: a setting is not a disturbance to skip
// when its target is down or its database restarting, but one to make.
func persist(ctx context.Context, set func() error) error {
	var err error
	for range 10 {
		if err = set(); err == nil {
			return nil
		}
		pause.For(ctx, 500*time.Millisecond)
		if ctx.Err() != nil {
			return err
		}
	}
	return err
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return " (not set: " + err.Error() + ")"
}
