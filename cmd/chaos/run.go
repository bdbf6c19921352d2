package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemlab/idemlab/cmd/chaos/check"
	"github.com/idemlab/idemlab/cmd/chaos/cluster"
	"github.com/idemlab/idemlab/cmd/chaos/history"
	"github.com/idemlab/idemlab/cmd/chaos/nemesis"
	"github.com/idemlab/idemlab/cmd/chaos/procs"
	"github.com/idemlab/idemlab/cmd/chaos/report"
	"github.com/idemlab/idemlab/cmd/chaos/workload"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/policies"
)

// adminToken is the demo admin's token, which a reset keeps.
const adminToken = "demo-admin"

// fakeSpecs are the fake external systems, each run as `web <name>`: the
// variable it listens on, the one the app finds it by, and the one that
// tells a restarted app whether it is idempotent ("": the app has none, so
// the nemesis keeps that fake idempotent).
var fakeSpecs = []struct{ name, addrEnv, urlEnv, idempotentEnv string }{
	{"provider", "PROVIDER_ADDR", "PROVIDER_URL", "PROVIDER_IDEMPOTENT_CALLS"},
	{"payments", "PAYMENTS_ADDR", "PAYMENTS_URL", ""},
}

// chaosRun is the system under test and its record.
type chaosRun struct {
	cfg   config
	out   io.Writer
	dir   string
	log   *history.Log
	db    *cluster.DB
	fakes []nemesis.Fake   // each fake's process and the proxy in front of it
	nats  []*procs.Process // the events' broker, one node or a cluster (none with -transport river)
	// broker is the events' broker or queue with -transport kafka (`web
	// kafka`) or tasks (`web tasks`): a process of its own, as nats is, so
	// a killed instance does not take it along.
	broker *procs.Process
	apps   []*procs.Process
	data   *workload.Dataset
	closed bool
}

// newRun builds the web binary and starts the database, the fakes, a
// proxy in front of each and the app instances (-instances), then loads the
// dataset. On error the parts already started are in the returned run,
// for close.
func newRun(ctx context.Context, cfg config, out io.Writer) (*chaosRun, error) {
	r := &chaosRun{cfg: cfg, out: out, dir: cfg.Out, log: history.NewLog(cfg.Seed)}
	if err := os.RemoveAll(r.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	bin := cfg.Bin
	if bin == "" {
		root, err := procs.ModuleRoot()
		if err != nil {
			return nil, err
		}
		r.say("building ./cmd/web")
		if bin, err = procs.Build(ctx, root, r.dir); err != nil {
			return nil, err
		}
	}

	r.say("starting a private PostgreSQL")
	var err error
	if r.db, err = cluster.Start(r.dir, cfg.FailoverEvery > 0); err != nil {
		return r, err
	}
	onExit := nemesis.OnExit(r.log)

	// The events' broker, when they travel over NATS: a nats-server of the
	// run's own (JetStream, its store in the run's folder), so no other
	// idemlab on the machine shares its streams.
	var eventsEnv []string
	if cfg.Transport == events.TransportNATS {
		natsURL, err := r.startNATS(ctx, onExit)
		if err != nil {
			return r, err
		}
		eventsEnv = append(eventsEnv, "NATS_URL="+natsURL, fmt.Sprintf("EVENTS_REPLICAS=%d", cfg.NATSNodes))
	}
	switch cfg.Transport {
	case events.TransportKafka, events.TransportTasks:
		env, err := r.startBroker(ctx, bin, onExit)
		if err != nil {
			return r, err
		}
		eventsEnv = append(eventsEnv, env...)
	}
	eventsEnv = append(eventsEnv, "EVENTS_TRANSPORT="+cfg.Transport)

	// Each fake as its own process, with a proxy in front: the network
	// the nemesis delays. A call whose caller gave up stays open at the
	// fake for up to 10 s.
	// The apps' addresses first: the fakes call app-1 back.
	appAddrs := make([]string, cfg.Instances)
	for i := range appAddrs {
		if appAddrs[i], err = procs.FreeAddr(); err != nil {
			return r, err
		}
	}
	var fakeEnv []string
	for _, fs := range fakeSpecs {
		addr, err := procs.FreeAddr()
		if err != nil {
			return r, err
		}
		p, err := procs.Start(ctx, procs.Spec{
			Name: fs.name, Bin: bin, Args: []string{fs.name},
			Env: []string{"DATABASE_URL=" + r.db.URL(), fs.addrEnv + "=" + addr, "LOG_FORMAT=json", "SHUTDOWN_GRACE=2s", "DEMO_MODE=true",
				"WEBHOOK_URL=http://" + appAddrs[0], "WEBHOOK_SECRET=" + webhookSecret},
			Addr: addr, ReadyPath: "/v1/faults", LogPath: filepath.Join(r.dir, "logs", fs.name+".log"),
		}, onExit)
		if err != nil {
			return r, err
		}
		proxy, err := netfault.Listen(addr, netfault.Options{Linger: 10 * time.Second})
		if err != nil {
			return r, err
		}
		r.fakes = append(r.fakes, nemesis.Fake{Name: fs.name, Process: p, Proxy: proxy, IdempotentEnv: fs.idempotentEnv})
		fakeEnv = append(fakeEnv, fs.urlEnv+"="+proxy.URL())
	}

	for i := range cfg.Instances {
		name, addr := fmt.Sprintf("app-%d", i+1), appAddrs[i]
		env := append(append(append(cfg.appEnv(r.db.URL()), fakeEnv...), eventsEnv...), "ADDR="+addr, "INSTANCE_ID="+name)
		app, err := procs.Start(ctx, procs.Spec{
			Name: name, Bin: bin, Args: []string{"serve"}, Env: env,
			Addr: addr, ReadyPath: "/healthz", LogPath: filepath.Join(r.dir, "logs", name+".log"),
		}, onExit)
		if err != nil {
			return r, err
		}
		r.apps = append(r.apps, app)
	}

	r.say("loading the dataset")
	size := workload.Size{Users: cfg.Users, PoliciesPerUser: cfg.Policies, Slots: cfg.Slots}
	if r.data, err = workload.Load(ctx, r.instances()[0], adminToken, size, cfg.Seed); err != nil {
		return r, err
	}
	// The callbacks, after the load (its reset turns them off).
	for _, f := range r.fakes {
		if err := setCallbacks(ctx, f.Process.URL(), cfg.Callbacks); err != nil {
			return r, fmt.Errorf("%s callbacks: %w", f.Name, err)
		}
	}
	return r, nil
}

// setCallbacks sets a fake's callback mode through its own control API
// (PUT /v1/webhooks; loopback callers may).
func setCallbacks(ctx context.Context, fakeURL, mode string) error {
	body := fmt.Sprintf(`{"mode": %q, "delay_ms": 1500}`, mode)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, fakeURL+"/v1/webhooks", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("PUT /v1/webhooks: %d %s", resp.StatusCode, msg)
	}
	return nil
}

// natsServer is the broker binary Debian's nats-server package installs.
const natsServer = "/usr/sbin/nats-server"

// startNATS runs private nats-servers with JetStream — one, or with
// -nats-nodes a cluster routed together — and returns the URL listing
// them. Each one's monitoring port answers /healthz once JetStream is on.
func (r *chaosRun) startNATS(ctx context.Context, onExit func(procs.Exit)) (string, error) {
	if _, err := os.Stat(natsServer); err != nil {
		return "", fmt.Errorf("%s not found (apt-get install nats-server), or run with -transport river: %w", natsServer, err)
	}
	type node struct{ client, monitor, routes string }
	nodes := make([]node, r.cfg.NATSNodes)
	for i := range nodes {
		for _, addr := range []*string{&nodes[i].client, &nodes[i].monitor, &nodes[i].routes} {
			var err error
			if *addr, err = procs.FreeAddr(); err != nil {
				return "", err
			}
		}
	}
	var urls []string
	for i, n := range nodes {
		name := "nats"
		if len(nodes) > 1 {
			name = fmt.Sprintf("nats-%d", i+1)
		}
		_, clientPort, _ := net.SplitHostPort(n.client)
		_, monitorPort, _ := net.SplitHostPort(n.monitor)
		args := []string{"-a", "127.0.0.1", "-p", clientPort, "-m", monitorPort, "-js", "-sd", filepath.Join(r.dir, name)}
		if len(nodes) > 1 {
			var routes []string
			for j, other := range nodes {
				if j != i {
					routes = append(routes, "nats://"+other.routes)
				}
			}
			args = append(args, "-n", name, "--cluster_name", "chaos", "--cluster", "nats://"+n.routes,
				"--routes", strings.Join(routes, ","))
		}
		p, err := procs.Start(ctx, procs.Spec{
			Name: name, Bin: natsServer, Args: args,
			Addr: n.monitor, ReadyPath: "/healthz?js-enabled-only=true", LogPath: filepath.Join(r.dir, "logs", name+".log"),
		}, onExit)
		if err != nil {
			return "", err
		}
		r.nats = append(r.nats, p)
		urls = append(urls, "nats://"+n.client)
	}
	return strings.Join(urls, ","), nil
}

// startBroker runs the embedded Kafka broker (`web kafka`, its log in the
// run's folder) or the fake task queue (`web tasks`, its state in the
// run's database) alone, and returns what the instances need to reach it.
// Task pushes go to each instance's own address (the one that created the
// task; the queue retries while it is down) with one token for both.
func (r *chaosRun) startBroker(ctx context.Context, bin string, onExit func(procs.Exit)) ([]string, error) {
	addr, err := procs.FreeAddr()
	if err != nil {
		return nil, err
	}
	spec := procs.Spec{Name: r.cfg.Transport, Bin: bin, Args: []string{r.cfg.Transport}, Addr: addr,
		Env:     []string{"DATABASE_URL=" + r.db.URL(), "LOG_FORMAT=json", "SHUTDOWN_GRACE=2s"},
		LogPath: filepath.Join(r.dir, "logs", r.cfg.Transport+".log")}
	var env []string
	if r.cfg.Transport == events.TransportKafka {
		spec.Env = append(spec.Env, "KAFKA_ADDR="+addr, "KAFKA_DATA_DIR="+filepath.Join(r.dir, "kafka"))
		env = []string{"KAFKA_BROKERS=" + addr}
	} else {
		spec.Env = append(spec.Env, "TASKS_ADDR="+addr)
		spec.ReadyPath = "/v2/projects/idemlab/locations/local/queues/events-ledger/tasks?pageSize=1"
		env = []string{"TASKS_URL=http://" + addr, "TASKS_PUSH_TOKEN=chaos-run-push-token"}
	}
	if r.broker, err = procs.Start(ctx, spec, onExit); err != nil {
		return nil, err
	}
	return env, nil
}

func (r *chaosRun) instances() []workload.Instance {
	out := make([]workload.Instance, len(r.apps))
	for i, a := range r.apps {
		out[i] = workload.Instance{Name: a.Name(), URL: a.URL()}
	}
	return out
}

func (r *chaosRun) say(format string, args ...any) {
	if !r.cfg.Quiet {
		fmt.Fprintf(r.out, "chaos: "+format+"\n", args...)
	}
}

// execute is the run proper: faults and clients for the duration, heal,
// drain, checks, report. It returns the number of violations.
func (r *chaosRun) execute(ctx context.Context) (int, error) {
	r.say("%d customers, %d policies, %d slots; faults for %s (seed %d)", len(r.data.Customers), len(r.data.Policies), len(r.data.Slots), r.cfg.Duration, r.cfg.Seed)
	r.log.Started = time.Now()

	// Every crash point `web serve` knows: the cancellation's and the
	// events' (outbox insert, relay, consumers).
	var points []string
	for _, p := range slices.Concat(policies.CrashPoints, events.CrashPoints) {
		points = append(points, string(p))
	}
	nem := nemesis.New(nemesis.Config{
		Seed: r.cfg.Seed, KillEvery: r.cfg.KillEvery, CrashShare: r.cfg.CrashShare,
		HoldShare: r.cfg.HoldShare, NotIdempotentShare: r.cfg.NotIdempotentShare,
		PauseEvery: r.cfg.PauseEvery, DelayEvery: r.cfg.DelayEvery, FlipEvery: r.cfg.FlipEvery,
		DBEvery: r.cfg.DBEvery, FailoverEvery: r.cfg.FailoverEvery, NATSKillEvery: r.cfg.NATSKillEvery, CrashPoints: points, ProviderTimeout: r.cfg.ProviderTimeout,
		CallbackEvery: r.cfg.CallbackEvery, ReorderEvery: r.cfg.ReorderEvery,
	}, nemesis.Targets{
		Apps:       r.apps,
		Fakes:      r.fakes,
		DB:         r.db,
		NATS:       r.nats,
		AdminToken: adminToken,
	}, r.log)

	// The clients run until the drain ends (or gives up); the nemesis
	// until the duration is over.
	clientCtx, stopClients := context.WithCancel(ctx)
	defer stopClients()
	clients := workload.Start(clientCtx, workload.Config{
		Clients: r.cfg.Clients, Timeout: r.cfg.Timeout, DoubleSend: r.cfg.DoubleSend,
		ReleaseChance: 0.95, StopChance: r.cfg.StopChance, AdminToken: adminToken, Seed: r.cfg.Seed, Nonce: fmt.Sprintf("%d-%d", r.cfg.Seed, time.Now().UnixNano()%1e9),
	}, r.data, r.instances(), r.log)

	faultCtx, stopFaults := context.WithTimeout(ctx, r.cfg.Duration)
	defer stopFaults()
	progressDone := r.progress(faultCtx)
	nem.Run(faultCtx)
	<-progressDone
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}

	r.say("healing")
	clients.Stop()
	r.log.Healed = time.Now()
	healCtx, cancelHeal := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelHeal()
	if err := nem.Heal(healCtx); err != nil {
		return 0, fmt.Errorf("heal: %w", err)
	}

	r.say("draining: every intent answered, every operation finished")
	drainDeadline := time.Now().Add(r.cfg.Drain)
	waited := make(chan struct{})
	go func() { clients.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(time.Until(drainDeadline)):
		stopClients() // the intents still unanswered are abandoned
		<-waited
	}
	if err := r.waitQuiet(ctx, drainDeadline); err != nil {
		r.log.Note(err.Error())
	}
	r.log.Drained = time.Now()

	r.say("checking")
	intents, faults := r.log.Snapshot()
	checkCtx, cancelCheck := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelCheck()
	end, err := check.Fetch(checkCtx, check.Source{
		App: r.instances()[0], Instances: r.instances(), AdminToken: adminToken,
		Customers: r.data.Customers, ProviderURL: r.fakes[0].Process.URL(),
	}, intents)
	if err != nil {
		return 0, fmt.Errorf("reading the end state: %w", err)
	}
	violations := check.Run(intents, faults, end)
	kinds := check.Kinds5xx(intents, causes(r.appLogs()))
	sum := report.Summarize(r.log, intents, faults, end, kinds, violations, r.cfg.settings())
	if err := writeJSON(filepath.Join(r.dir, "endstate.json"), end); err != nil {
		return 0, err
	}
	if err := r.write(sum, violations); err != nil {
		return 0, err
	}
	sum.Text(r.out)
	fmt.Fprintf(r.out, "report: %s\n", filepath.Join(r.dir, "report.html"))
	if r.cfg.Keep {
		r.keep(ctx)
	}
	return len(violations), nil
}

// keep prints where everything runs and waits for Ctrl-C: the state a
// violation left behind can then be read with psql and the API.
func (r *chaosRun) keep(ctx context.Context) {
	fmt.Fprintf(r.out, "kept running until Ctrl-C:\n  DATABASE_URL=%s\n", r.db.URL())
	for _, a := range r.apps {
		fmt.Fprintf(r.out, "  %s %s (Authorization: Bearer %s)\n", a.Name(), a.URL(), adminToken)
	}
	for _, f := range r.fakes {
		fmt.Fprintf(r.out, "  %s %s\n", f.Name, f.Process.URL())
	}
	<-ctx.Done()
}

// progress prints a line every ten seconds until ctx ends.
func (r *chaosRun) progress(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
			intents, faults := r.log.Snapshot()
			requests, answered, fivexx := 0, 0, 0
			for _, in := range intents {
				requests += len(in.Attempts)
				if in.FinalAnswer() != nil {
					answered++
				}
				for _, a := range in.Attempts {
					if a.Status >= 500 {
						fivexx++
					}
				}
			}
			kinds := map[string]int{}
			for _, f := range faults {
				kinds[f.Kind]++
			}
			r.say("%4.0fs  intents %d (answered %d)  requests %d  5xx %d  kills %d  pauses %d  delays %d  db %d  flips %d",
				time.Since(start).Seconds(), len(intents), answered, requests, fivexx,
				kinds[history.Kill]+kinds[history.CrashKill], kinds[history.Pause], kinds[history.Delay]+kinds[history.Hold],
				kinds[history.DBRestart]+kinds[history.DBDown]+kinds[history.Failover], kinds[history.Flip])
		}
	}()
	return done
}

// write saves the report, the timeline on its own, the history and the
// violations in the run's folder.
func (r *chaosRun) write(sum report.Summary, vs []check.Violation) error {
	f, err := os.Create(filepath.Join(r.dir, "report.html"))
	if err != nil {
		return err
	}
	err = errors.Join(sum.HTML(f), f.Close())
	err = errors.Join(err, os.WriteFile(filepath.Join(r.dir, "timeline.svg"), []byte(sum.SVG()), 0o644))
	err = errors.Join(err, writeJSON(filepath.Join(r.dir, "history.json"), r.log))
	if vs == nil {
		vs = []check.Violation{}
	}
	return errors.Join(err, writeJSON(filepath.Join(r.dir, "violations.json"), vs))
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (r *chaosRun) appLogs() []string {
	var paths []string
	for _, a := range r.apps {
		paths = append(paths, filepath.Join(r.dir, "logs", a.Name()+".log"))
	}
	return paths
}

// close stops everything the run started, apps first.
func (r *chaosRun) close() {
	if r.closed {
		return
	}
	r.closed = true
	for _, a := range r.apps {
		a.Stop(3 * time.Second)
	}
	for _, f := range r.fakes {
		f.Proxy.Close()
		f.Process.Stop(3 * time.Second)
	}
	for _, n := range r.nats {
		n.Stop(3 * time.Second)
	}
	if r.broker != nil {
		r.broker.Stop(3 * time.Second)
	}
	if r.db != nil {
		r.db.Close()
	}
}
