// Package nemesis injects the faults of a chaos run: it kills and pauses
// processes, restarts the database, delays and holds the traffic between
// the app and its fakes, and flips the fakes' fault modes — at seeded
// random moments, each kind on its own schedule, until it is told to stop.
// Then Heal lifts every fault.
//
// It is bounded on purpose. It never disturbs both app instances at once
// (one always serves, so the clients' retries can land somewhere); each
// disturbance ends by itself (a pause is resumed, a delay window closes, a
// killed process comes back); and when a fake stops being idempotent the
// app is told first, so a double effect found by the run is the app's
// fault and not the harness's.
//
// The same seed gives the same sequence of decisions (what, where, how
// long). The moments they land on depend on the machine, so a run is
// reproducible in its shape, not to the millisecond.
package nemesis

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/cluster"
	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/cmd/chaos/procs"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/pause"
)

// Config says how often each kind of fault comes. Each Every is a mean:
// the waits are drawn uniformly from half to one and a half times it.
// Zero turns that kind off.
type Config struct {
	Seed       uint64
	KillEvery  time.Duration // SIGKILL of an app instance or a fake
	CrashShare float64       // of app kills, the share made at a crash point
	PauseEvery time.Duration // SIGSTOP for 1–4 s
	DelayEvery time.Duration // a window of 0.6–2.5 s delays, or held calls
	FlipEvery  time.Duration // a new fault mode at a fake
	DBEvery    time.Duration // an immediate restart, or a stop of 1–3 s
	// FailoverEvery: the primary killed and its synchronous standby
	// promoted (the run's database started with a standby).
	FailoverEvery time.Duration
	// NATSKillEvery: SIGKILL of one node of the JetStream cluster, never
	// two at once (a majority keeps the stream).
	NATSKillEvery time.Duration
	// CallbackEvery: a new callback mode at a fake (ok, duplicate, delay,
	// reorder, lost). ReorderEvery: the next few deliveries to the history
	// consumer sent back, so later events of their aggregate overtake them.
	CallbackEvery time.Duration
	ReorderEvery  time.Duration
	// CrashPoints are the points a crash kill may arm.
	CrashPoints []string
	// HoldShare is the share of network windows that hold calls instead of
	// delaying traffic; NotIdempotentShare the share of fault flips that
	// make a fake not idempotent.
	HoldShare          float64
	NotIdempotentShare float64
	// ProviderTimeout is the app's PROVIDER_TIMEOUT: held calls are held
	// past it, so the app's call times out while the call is still on its way.
	ProviderTimeout time.Duration
}

// Fake is one fake external system the app calls through a proxy.
type Fake struct {
	Name    string // provider, payments: also the app's name for it
	Process *procs.Process
	Proxy   *netfault.Proxy
	// IdempotentEnv is the variable that tells a restarted app instance
	// whether this system is idempotent, when it cannot be told at run time.
	IdempotentEnv string
}

// Targets is what the nemesis can act on.
type Targets struct {
	Apps       []*procs.Process
	Fakes      []Fake
	DB         *cluster.DB
	NATS       []*procs.Process // the JetStream cluster's nodes
	AdminToken string
}

// Nemesis is one run's fault injector.
type Nemesis struct {
	cfg Config
	t   Targets
	log *history.Log
	app *appAdmin

	// busy marks app instances a disturbance is using (a pause, an armed
	// crash point), so the other one is left alone.
	mu           sync.Mutex
	busy         map[string]bool
	idempotent   map[string]bool // what each fake is now
	belief       map[string]bool // what the app was last told
	beliefAtRun  bool            // the app can be told at run time
	actions      sync.WaitGroup  // disturbances still under way
	beliefChange sync.Mutex      // one flip of idempotency at a time
}

// New prepares a nemesis; Run starts it.
func New(cfg Config, t Targets, log *history.Log) *Nemesis {
	n := &Nemesis{cfg: cfg, t: t, log: log, busy: map[string]bool{}, idempotent: map[string]bool{}, belief: map[string]bool{}}
	n.app = &appAdmin{token: t.AdminToken, http: adminHTTP}
	for _, f := range t.Fakes {
		n.idempotent[f.Name], n.belief[f.Name] = true, true
	}
	return n
}

// Run injects faults until ctx ends, then waits for the disturbances under
// way to end by themselves (a pause to be resumed, a window to close).
func (n *Nemesis) Run(ctx context.Context) {
	n.beliefAtRun = n.app.canTellBelief(ctx, n.t.Apps[0].URL())
	if !n.beliefAtRun {
		for _, f := range n.t.Fakes {
			if f.IdempotentEnv != "" {
				n.log.Note("the app has no PUT /api/v1/admin/systems/{name}: " + f.Name + "'s idempotency is told by restarting both instances with " + f.IdempotentEnv)
			} else {
				n.log.Note("the app cannot be told whether " + f.Name + " is idempotent: it stays idempotent throughout")
			}
		}
	}
	var loops sync.WaitGroup
	every := func(kind uint64, mean time.Duration, act func(ctx context.Context, rng *rand.Rand)) {
		if mean <= 0 {
			return
		}
		rng := rand.New(rand.NewPCG(n.cfg.Seed, kind))
		loops.Add(1)
		go func() {
			defer loops.Done()
			for {
				wait := mean/2 + time.Duration(rng.Int64N(int64(mean)))
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				act(ctx, rng)
			}
		}()
	}
	every(1, n.cfg.KillEvery, n.kill)
	every(2, n.cfg.PauseEvery, n.pause)
	every(3, n.cfg.DelayEvery, n.delay)
	every(4, n.cfg.FlipEvery, n.flip)
	every(5, n.cfg.DBEvery, n.restartDB)
	every(6, n.cfg.FailoverEvery, n.failover)
	every(7, n.cfg.NATSKillEvery, n.killNATS)
	every(8, n.cfg.CallbackEvery, n.flipCallbacks)
	every(9, n.cfg.ReorderEvery, n.reorder)
	loops.Wait()
	n.actions.Wait()
}

// OnExit turns a process exit into a history fault; the run wires it into
// every process's supervisor.
func OnExit(log *history.Log) func(procs.Exit) {
	return func(ex procs.Exit) {
		f := history.Fault{Target: ex.Name, Start: ex.At}
		switch ex.Reason {
		case procs.ByNemesis:
			f.Kind = history.Kill
		case procs.ByCrash:
			f.Kind, f.Detail = history.CrashKill, ex.Point
		case procs.OnItsOwn:
			f.Kind, f.Detail = history.Exit, ex.Status+"\n"+ex.LogTail
		default:
			return // the end of the run
		}
		log.Injected(f)
	}
}

// calmApp picks an app instance that may be disturbed now: not busy, and
// the other instance serving. It marks it busy; release with n.calm.
func (n *Nemesis) calmApp(rng *rand.Rand) (*procs.Process, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := rng.IntN(len(n.t.Apps))
	target := n.t.Apps[i]
	if n.busy[target.Name()] || !target.Serving() {
		return nil, false
	}
	for _, other := range n.t.Apps {
		if other != target && (n.busy[other.Name()] || !other.Serving()) {
			return nil, false // the other one is down or disturbed: leave both alone
		}
	}
	n.busy[target.Name()] = true
	return target, true
}

func (n *Nemesis) calm(p *procs.Process) {
	n.mu.Lock()
	delete(n.busy, p.Name())
	n.mu.Unlock()
}

// kill: SIGKILL an app instance (sometimes at a crash point instead) or,
// one time in six, a fake. The exit itself is recorded by OnExit.
func (n *Nemesis) kill(ctx context.Context, rng *rand.Rand) {
	down := 200*time.Millisecond + time.Duration(rng.Int64N(int64(1800*time.Millisecond)))
	if len(n.t.Fakes) > 0 && rng.IntN(6) == 0 {
		f := n.t.Fakes[rng.IntN(len(n.t.Fakes))]
		f.Process.Kill(down)
		return
	}
	app, ok := n.calmApp(rng)
	if !ok {
		return
	}
	if len(n.cfg.CrashPoints) == 0 || rng.Float64() >= n.cfg.CrashShare {
		app.Kill(down)
		n.calm(app)
		return
	}
	point := n.cfg.CrashPoints[rng.IntN(len(n.cfg.CrashPoints))]
	if rng.IntN(2) == 0 {
		// CRASH_AT at restart: the next run dies at the point's first pass.
		app.Kill(down, "CRASH_AT="+point)
		n.watchCrash(ctx, app, app.Runs()+1, true)
		return
	}
	// Armed at run time, once: dies at the next cancellation to pass it.
	if err := n.app.armCrash(ctx, app.URL(), point); err != nil {
		n.calm(app)
		return
	}
	n.watchCrash(ctx, app, app.Runs(), false)
}

// watchCrash keeps app busy until the run that carries an armed crash
// point has died; after 15 s without a pass it is disarmed.
func (n *Nemesis) watchCrash(ctx context.Context, app *procs.Process, armedRun int, fromEnv bool) {
	n.actions.Add(1)
	go func() {
		defer n.actions.Done()
		defer n.calm(app)
		deadline := time.Now().Add(15 * time.Second)
		for app.Runs() <= armedRun && time.Now().Before(deadline) && ctx.Err() == nil {
			if fromEnv && app.Runs() < armedRun {
				deadline = time.Now().Add(15 * time.Second) // not restarted yet
			}
			time.Sleep(100 * time.Millisecond)
		}
		if app.Runs() == armedRun {
			n.app.disarmCrash(context.Background(), app.URL())
		}
	}()
}

// pause: SIGSTOP an app instance (or, one time in five, a fake) for 1–4 s.
func (n *Nemesis) pause(ctx context.Context, rng *rand.Rand) {
	d := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
	var p *procs.Process
	if len(n.t.Fakes) > 0 && rng.IntN(5) == 0 {
		p = n.t.Fakes[rng.IntN(len(n.t.Fakes))].Process
		if !p.Serving() {
			return
		}
	} else {
		app, ok := n.calmApp(rng)
		if !ok {
			return
		}
		p = app
		defer n.calm(app)
	}
	start := time.Now()
	if !p.Pause() {
		return
	}
	n.actions.Add(1)
	defer n.actions.Done()
	time.Sleep(d) // a pause ends by itself, even at heal: that is the point of it
	p.Resume()
	n.log.Injected(history.Fault{Kind: history.Pause, Target: p.Name(), Start: start, End: time.Now()})
}

// delay: a window of 2–6 s in which the traffic between the app and a fake
// is delayed by 0.6–2.5 s (one direction or both), or — HoldShare of the
// time — the next one to three calls are held past the app's timeout and
// then delivered.
func (n *Nemesis) delay(ctx context.Context, rng *rand.Rand) {
	if len(n.t.Fakes) == 0 {
		return
	}
	f := n.t.Fakes[rng.IntN(len(n.t.Fakes))]
	start := time.Now()
	if rng.Float64() < n.cfg.HoldShare {
		calls := 1 + rng.IntN(3)
		hold := n.cfg.ProviderTimeout + 500*time.Millisecond + time.Duration(rng.Int64N(int64(2500*time.Millisecond)))
		f.Proxy.HoldNext(calls, hold, "POST ")
		n.log.Injected(history.Fault{Kind: history.Hold, Target: f.Name, Start: start, End: start.Add(hold),
			Detail: itoa(calls) + " calls held " + hold.Round(time.Millisecond).String()})
		return
	}
	d := 600*time.Millisecond + time.Duration(rng.Int64N(int64(1900*time.Millisecond)))
	window := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
	var up, down time.Duration
	dir := ""
	switch rng.IntN(3) {
	case 0:
		up, dir = d, "app→"+f.Name
	case 1:
		down, dir = d, f.Name+"→app"
	default:
		up, down, dir = d, d, "both ways"
	}
	f.Proxy.SetDelay(up, down)
	n.actions.Add(1)
	defer n.actions.Done()
	pause.For(ctx, window)
	f.Proxy.SetDelay(0, 0)
	n.log.Injected(history.Fault{Kind: history.Delay, Target: f.Name, Start: start, End: time.Now(),
		Detail: d.Round(time.Millisecond).String() + " " + dir})
}

// restartDB: an immediate restart three times in four, else the database
// is down for 1–3 s.
func (n *Nemesis) restartDB(ctx context.Context, rng *rand.Rand) {
	n.actions.Add(1)
	defer n.actions.Done()
	start := time.Now()
	if rng.IntN(4) > 0 {
		away, err := n.t.DB.RestartImmediately()
		n.log.Injected(history.Fault{Kind: history.DBRestart, Target: "postgres", Start: start, End: start.Add(away), Detail: errDetail(err)})
		return
	}
	down := time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
	away, err := n.t.DB.DownFor(down)
	n.log.Injected(history.Fault{Kind: history.DBDown, Target: "postgres", Start: start, End: start.Add(away), Detail: errDetail(err)})
}

// failover kills the primary and promotes its synchronous standby: no
// acknowledged key may be lost (docs/scaling.md).
func (n *Nemesis) failover(ctx context.Context, rng *rand.Rand) {
	n.actions.Add(1)
	defer n.actions.Done()
	start := time.Now()
	away, err := n.t.DB.Failover()
	n.log.Injected(history.Fault{Kind: history.Failover, Target: "postgres", Start: start, End: start.Add(away), Detail: errDetail(err)})
}

// killNATS SIGKILLs one node of the JetStream cluster — the stream's
// leader among them, as often as any other — and restarts it after 1–4 s,
// when every node is serving (one lost node leaves a majority). The exit is
// recorded by OnExit.
func (n *Nemesis) killNATS(ctx context.Context, rng *rand.Rand) {
	for _, node := range n.t.NATS {
		if !node.Serving() {
			return
		}
	}
	down := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
	n.t.NATS[rng.IntN(len(n.t.NATS))].Kill(down)
}

// Heal lifts every fault: delays and holds, armed crash points, fault
// modes (the fakes healthy and idempotent, the app told so), the database
// up, every process serving. Call it after Run has returned.
func (n *Nemesis) Heal(ctx context.Context) error {
	start := time.Now()
	for _, f := range n.t.Fakes {
		f.Proxy.Heal()
	}
	for _, app := range n.t.Apps {
		n.app.disarmCrash(ctx, app.URL())
	}
	if err := n.t.DB.EnsureUp(); err != nil {
		return err
	}
	for _, f := range n.t.Fakes {
		if err := n.setIdempotent(ctx, f, healthy(), true, history.Heal); err != nil {
			return err
		}
		n.mu.Lock()
		believed := n.belief[f.Name]
		n.mu.Unlock()
		if !believed { // a flip cut short by the end of the run
			if err := n.tellApp(ctx, f, true); err != nil {
				return err
			}
		}
	}
	for _, p := range n.processes() {
		p.Resume()
		if err := p.WaitReady(ctx, time.Minute); err != nil {
			return err
		}
	}
	n.clearReorder(ctx) // out_of_order only delays; cleared so the drain is not slowed
	// A crash point armed by CRASH_AT in a run that started during the heal.
	for _, app := range n.t.Apps {
		n.app.disarmCrash(ctx, app.URL())
	}
	n.log.Injected(history.Fault{Kind: history.Heal, Target: "all", Start: start, End: time.Now()})
	return nil
}

func (n *Nemesis) processes() []*procs.Process {
	ps := append([]*procs.Process(nil), n.t.Apps...)
	for _, f := range n.t.Fakes {
		ps = append(ps, f.Process)
	}
	return ps
}

func errDetail(err error) string {
	if err != nil {
		return err.Error()
	}
	return ""
}
