package labs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/pgcluster"
)

// Lab 13: the failover window. Where the idempotency state lives decides
// what a failure can lose — and a failover of PostgreSQL is a failure of
// the place it lives. With asynchronous replication a commit is answered
// before the standby has it; the primary's death loses the key, the
// operation and the stored answer together, and the retry runs again. A
// synchronous standby makes the commit wait until the standby has it.
//
// The servers are the test suite's (internal/pgcluster: Debian's binaries,
// a folder and ports of their own), so nothing of the app's database is
// touched: the keys and operations live on the private primary, the
// provider (the labs' fake system) keeps its own state in the app's
// database, away from the failover — as a real one would.
var failoverLab = &Lab{
	Number: 13,
	Needs:  "Debian's PostgreSQL server binaries (" + strings.Join(pgcluster.StandbyBinaries, ", ") + ")",
	Name:   "failover",
	Title:  "The failover window",
	Summary: "Keys, operations and answers committed on a primary that dies: with asynchronous replication the " +
		"standby never had the last of them and their retries run again; with a synchronous standby nothing " +
		"acknowledged is lost.",
	Lesson: "Every cancellation's key, operation and stored answer commit together on the primary; when it dies a " +
		"streaming standby takes over. The lab starts a private PostgreSQL primary with a standby and sends five " +
		"keyed cancellations: three while the standby keeps up; then the standby is cut off (a lagging standby, a " +
		"network blip) and two more are sent; the primary is killed and the standby promoted; the client sends every " +
		"key again. With asynchronous replication the two were answered 200 and never reached the standby: their " +
		"retries find no key and run again — a new operation, so a new provider key, and the policy is cancelled a " +
		"second time. Nothing catches it: UNIQUE(policy_id, operation_type) lost its row with the rest. A provider " +
		"key made from the business identity (policy + cancel) catches the second call, but the answers are still " +
		"lost. With a synchronous standby (synchronous_commit = on) the two commits wait for the standby and are " +
		"never answered; the kill turns them into 503s, and their retries run once. Nothing acknowledged is lost.",
	Columns: []Column{
		{Key: "acknowledged", Label: "answered 200 before the failover"},
		{Key: "lost", Label: "stored answers lost", Bad: true},
		{Key: "twice", Label: "executed twice", Bad: true},
		{Key: "caught_by_key", Label: "caught by the provider's key"},
		{Key: "caught_by_identity", Label: "caught by UNIQUE(policy_id, operation_type)"},
	},
	Try: "press Run the lab and wait while it runs (three failovers: about 15 s on an idle machine, longer on a busy one), then compare “stored answers lost” and " +
		"“executed twice” row by row: both asynchronous rows lose the answers of the two cancellations the standby " +
		"never got — the first cancels those policies twice, the second's provider key catches the repeat — and the " +
		"synchronous standby keeps both at zero, at the price of two cancellations left unanswered. Then read each " +
		"timeline from the line where the standby is cut off.",
	RunHint: "Starts a private PostgreSQL primary with a streaming standby, fails it over three times and removes " +
		"it: about 15 s on an idle machine, up to a minute or more on a busy one (it gives up at " + fmt.Sprint(int(failoverBound.Minutes())) + " minutes), one run at a time.",
	Code: []CodeRef{
		{Path: "internal/pgcluster/replication.go", Text: `"synchronous_commit":        "on",`,
			Says: "the synchronous variant: a commit returns once the standby has flushed it, not merely received it"},
		{Path: "internal/labs/failover.go", Text: "if err := s.standby.PauseStreaming(); err != nil {",
			Says: "the standby cut off: the window a lagging standby opens, made wide enough to see"},
		{Path: "internal/workflow/operation.go", Text: "func StepKey(operationID int64, step string, run int) string {",
			Says: "the app's provider key is the operation's id: the row that minted it is lost with the answer"},
		{Path: "internal/labs/failover.go", Text: `return e.name("failover", spec.name, "policy", strconv.FormatInt(subject, 10)) + ":cancel"`,
			Says: "a key from the business identity survives the lost row, so the provider catches the second call"},
	},
	run:   runFailover,
	check: func(cfg Config) error { return pgcluster.Check(cfg.PostgresBinDir) },
}

// The failover lab's schedule, the same for every variant.
const (
	failoverBefore = 3 // cancellations while the standby keeps up
	failoverDuring = 2 // cancellations once it is cut off, before the primary dies
	// failoverBound bounds a whole run, the servers' start included.
	failoverBound = 3 * time.Minute
	// failoverServerWait bounds each server's start, promotion and catch-up.
	failoverServerWait = 30 * time.Second
)

// failoverSpec is one variant: a replication setting, and where the
// provider's key comes from.
type failoverSpec struct {
	name, title string
	broken      bool
	synchronous bool
	// identityKey: the provider's key is made from the policy (the business
	// identity), not from the operation's id.
	identityKey bool
}

var failoverSpecs = []failoverSpec{
	{name: "async", title: "Asynchronous standby", broken: true},
	{name: "async-identity-key", title: "Asynchronous standby; the provider's key from the business identity", broken: true, identityKey: true},
	{name: "sync", title: "Synchronous standby (synchronous_commit = on)", synchronous: true},
}

func runFailover(ctx context.Context, e *env) ([]Variant, error) {
	// Two private servers and three failovers: one run at a time per process.
	select {
	case e.failoverRun <- struct{}{}:
		defer func() { <-e.failoverRun }()
	default:
		return nil, fmt.Errorf("%w: another run of the failover lab is under way (one at a time: each starts PostgreSQL servers of its own); try again in a minute", ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, failoverBound)
	defer cancel()
	sys, err := e.system(systemLabs)
	if err != nil {
		return nil, err
	}
	s, err := startFailoverServers(ctx, e)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var out []Variant
	for _, spec := range failoverSpecs {
		v, err := e.failoverWindow(ctx, sys, s, spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", spec.name, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// failoverServers are the lab's private primary and its streaming standby.
// Each variant ends in a failover: the standby becomes the primary, and the
// next variant copies a new standby from it.
type failoverServers struct {
	opts             pgcluster.Options
	primary, standby *pgcluster.Cluster
}

// startFailoverServers starts a primary, gives it the app's schema (the
// app's own migrations: the labs tables have the app's shape) and copies a
// standby from it.
func startFailoverServers(ctx context.Context, e *env) (*failoverServers, error) {
	if err := pgcluster.Check(e.cfg.PostgresBinDir); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	s := &failoverServers{opts: pgcluster.Options{BinDir: e.cfg.PostgresBinDir, StartTimeout: failoverServerWait}}
	var err error
	if s.primary, err = pgcluster.Start(s.opts); err != nil {
		return nil, fmt.Errorf("labs: failover: %w", err)
	}
	if err := migrate(ctx, s.primary.URL(), e); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// migrate applies the app's migrations to the database at url.
func migrate(ctx context.Context, url string, e *env) error {
	pool, err := database.Open(ctx, url, 2)
	if err != nil {
		return fmt.Errorf("labs: failover: %w", err)
	}
	defer pool.Close()
	m, err := database.NewMigrator(pool, e.cfg.Logger)
	if err != nil {
		return fmt.Errorf("labs: failover: %w", err)
	}
	defer m.Close()
	if err := m.Up(ctx); err != nil {
		return fmt.Errorf("labs: failover: migrate the private primary: %w", err)
	}
	return nil
}

// ensureStandby copies a standby from the primary unless one streams.
func (s *failoverServers) ensureStandby() error {
	if s.standby != nil {
		return nil
	}
	var err error
	if s.standby, err = pgcluster.StartStandby(s.primary, s.opts); err != nil {
		return fmt.Errorf("labs: failover: %w", err)
	}
	return nil
}

// failover kills the primary and promotes the standby, which from then on
// takes writes alone.
func (s *failoverServers) failover() error {
	if err := s.primary.Stop(true); err != nil {
		return fmt.Errorf("labs: failover: kill the primary: %w", err)
	}
	s.primary.Close()
	s.primary, s.standby = s.standby, nil
	if err := s.primary.Promote(); err != nil {
		return fmt.Errorf("labs: failover: %w", err)
	}
	return s.primary.SetSynchronous(false)
}

func (s *failoverServers) close() {
	for _, c := range []*pgcluster.Cluster{s.standby, s.primary} {
		if c != nil {
			c.Close()
		}
	}
}

// url is the pool's: both servers, and only a read-write one will do — the
// app's DATABASE_URL in docs/scaling.md.
func (s *failoverServers) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		s.primary.Port(), s.standby.Port())
}

// failoverWindow runs the schedule once with spec's setting.
func (e *env) failoverWindow(ctx context.Context, sys *fakeSystem, s *failoverServers, spec failoverSpec) (Variant, error) {
	v := Variant{Name: spec.name, Title: spec.title, Broken: spec.broken, Counts: map[string]int{}}
	if err := s.ensureStandby(); err != nil {
		return v, err
	}
	if err := s.primary.SetSynchronous(spec.synchronous); err != nil {
		return v, err
	}
	pc, err := pgxpool.ParseConfig(s.url())
	if err != nil {
		return v, err
	}
	pc.MaxConns = failoverDuring + 2
	pc.ConnConfig.ConnectTimeout = 3 * time.Second
	pc.ConnConfig.RuntimeParams["search_path"] = "labs" // the lab's tables, in the app's shape
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return v, err
	}
	defer pool.Close()

	// Every attempt's own lines (claimed, intent, provider) would bury the
	// schedule: the timeline tells each cancellation's outcome instead.
	quiet := newTimeline()
	keys := pgKeys(idempotency.NewStore(pool, 30*time.Second, time.Hour), e.user)
	n := failoverBefore + failoverDuring
	cs := make([]*cancellation, n)
	for i := range cs {
		subject, err := e.subject(ctx)
		if err != nil {
			return v, err
		}
		c := &cancellation{e: e, sys: sys, t: quiet, variant: spec.name, subject: subject, constrained: true,
			keys: keys, key: e.name("failover", spec.name, strconv.Itoa(i+1)), db: pool}
		if spec.identityKey {
			c.providerKey = func(int64) string {
				return e.name("failover", spec.name, "policy", strconv.FormatInt(subject, 10)) + ":cancel"
			}
		}
		cs[i] = c
	}
	t := newTimeline() // from here: the servers are up
	setting := "asynchronous: a commit returns once the primary has it"
	if spec.synchronous {
		setting = "synchronous: a commit returns once the standby has flushed it too"
	}
	t.say("lab", "a primary (port %d) and its streaming standby (port %d); replication %s", s.primary.Port(), s.standby.Port(), setting)

	// 1. The standby keeps up.
	first := make([]string, n)
	var start time.Time
	for i := range failoverBefore {
		if i == 1 {
			start = time.Now() // the first one opened the pool's connections
		}
		if first[i], err = cs[i].attempt(ctx, "client", ""); err != nil {
			return v, fmt.Errorf("cancellation %d: %w", i+1, err)
		}
	}
	each := time.Since(start) / (failoverBefore - 1)
	t.say("client", "cancellations 1–%d answered 200 (%s each, after the first): keys, operations and answers on the primary",
		failoverBefore, millis(each))
	if err := s.standby.CaughtUp(s.primary); err != nil {
		return v, err
	}
	t.say("standby", "has every one of them")

	// 2. The standby cut off, two more cancellations, the primary killed
	// once each has been answered or waits for the standby at its commit.
	if err := s.standby.PauseStreaming(); err != nil {
		return v, err
	}
	t.say("standby", "cut off: its streaming paused, as a lagging standby's or a network blip's")
	watch, err := pgx.Connect(ctx, s.primary.URL()) // the primary's sessions, seen from outside
	if err != nil {
		return v, err
	}
	type answered struct {
		answer string
		err    error
	}
	during := make([]answered, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	actx, stop := context.WithCancel(ctx) // ends the waiting commits if the schedule fails
	defer stop()
	for i := failoverBefore; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := cs[i].attempt(actx, "client", "")
			if err == nil {
				t.wrong("client", "cancellation %d answered %q — the primary has it, the standby never will", i+1, a)
			}
			mu.Lock()
			during[i], done = answered{a, err}, done+1
			mu.Unlock()
		}()
	}
	err = waitFor(ctx, failoverServerWait, func() (bool, error) {
		var waiting int
		err := watch.QueryRow(ctx, `
			SELECT count(*)
			  FROM pg_stat_activity
			 WHERE wait_event = 'SyncRep' -- a commit waiting for the synchronous standby`).Scan(&waiting)
		mu.Lock()
		defer mu.Unlock()
		return done+waiting >= failoverDuring, err
	})
	watch.Close(ctx)
	if err != nil {
		stop()
		wg.Wait()
		return v, err
	}
	mu.Lock()
	if waiting := failoverDuring - done; waiting > 0 {
		t.say("client", "%s sent: each commit waits for the standby, nothing is answered", plural(waiting, "cancellation"))
	}
	mu.Unlock()
	killed := s.primary.Port()
	if err := s.failover(); err != nil {
		stop()
		wg.Wait()
		return v, err
	}
	wg.Wait()
	t.say("primary", "killed (port %d, pg_ctl stop -m immediate); the standby promoted (pg_ctl promote): the pool's next connection finds it, read-write", killed)
	acknowledged := make([]bool, n)
	for i := range n {
		switch {
		case i < failoverBefore:
			acknowledged[i] = true
		case during[i].err == nil:
			acknowledged[i], first[i] = true, during[i].answer
		case database.IsUnavailable(during[i].err):
			t.say("client", "cancellation %d: the connection died before an answer — a 503: nothing was acknowledged", i+1)
		default:
			return v, fmt.Errorf("cancellation %d: %w", i+1, during[i].err)
		}
	}

	// 3. The client sends every key again.
	for i, c := range cs {
		answer, err := retryThroughFailover(ctx, c)
		if err != nil {
			return v, fmt.Errorf("retry of cancellation %d: %w", i+1, err)
		}
		effects, calls, err := e.providerTally(ctx, c.subject)
		if err != nil {
			return v, err
		}
		replayed := acknowledged[i] && answer == first[i]
		if acknowledged[i] {
			v.Counts["acknowledged"]++
		}
		switch {
		case replayed:
			t.say("client", "retry %d: the key is on the new primary — replayed %q", i+1, answer)
			continue
		case !acknowledged[i]:
			t.say("client", "retry %d: never answered, so never stored — it runs now, once: %q", i+1, answer)
			continue
		}
		v.Counts["lost"]++
		switch {
		case strings.HasPrefix(answer, "409"):
			v.Counts["caught_by_identity"]++
			t.wrong("client", "retry %d: no key on the new primary; UNIQUE(policy_id, operation_type) refused a second operation: %q", i+1, answer)
		case effects > 1:
			v.Counts["twice"]++
			t.wrong("provider", "retry %d: no key, no operation on the new primary — it ran again (%q, not %q): a new operation, a new provider key, and the policy cancelled %s",
				i+1, answer, first[i], times(effects))
		case calls > 1:
			v.Counts["caught_by_key"]++
			t.wrong("client", "retry %d: no key on the new primary — it ran again and heard %q, not %q; the provider's key caught the second call (cancelled once)",
				i+1, answer, first[i])
		}
	}
	v.Verdict = failoverVerdict(v.Counts, n, each)
	v.Timeline = t.list()
	return v, nil
}

// retryThroughFailover is the client after the failover: the same request
// with the same key until it is answered — through a dead connection (a
// 503) and a claim in progress (a 409), bounded.
func retryThroughFailover(ctx context.Context, c *cancellation) (string, error) {
	var answer string
	err := pollEvery(ctx, failoverServerWait, retryEvery, func() (bool, error) {
		a, err := c.attempt(ctx, "client", "")
		switch {
		case errors.Is(err, errInProgress), database.IsUnavailable(err):
			return false, nil
		case err != nil:
			return false, err
		}
		answer = a
		return true, nil
	})
	return answer, err
}

// providerTally is what the provider saw of subject: the effects it
// applied, and the calls it received (repeats of a key included).
func (e *env) providerTally(ctx context.Context, subject int64) (effects, calls int, err error) {
	err = e.lab.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM fake_effects WHERE subject_id = $1),
		       (SELECT coalesce(sum(attempts), 0) FROM fake_requests WHERE subject_id = $1)`, subject).Scan(&effects, &calls)
	if err != nil {
		return 0, 0, fmt.Errorf("labs: the provider's tally of %d: %w", subject, err)
	}
	return effects, calls, nil
}

func failoverVerdict(counts map[string]int, n int, each time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d answered before the failover", counts["acknowledged"], n)
	switch {
	case counts["lost"] == 0:
		b.WriteString("; nothing acknowledged was lost, nothing ran twice")
	case counts["twice"] > 0:
		fmt.Fprintf(&b, "; %s lost, %s cancelled twice — nothing caught it", plural(counts["lost"], "stored answer"), policyCount(counts["twice"]))
	default:
		fmt.Fprintf(&b, "; %s lost, each policy cancelled once (the provider's key)", plural(counts["lost"], "stored answer"))
	}
	fmt.Fprintf(&b, "; %s a cancellation while the standby kept up", millis(each))
	return b.String()
}

// policyCount says "1 policy", "2 policies".
func policyCount(n int) string {
	if n == 1 {
		return "1 policy"
	}
	return strconv.Itoa(n) + " policies"
}

// times says "once", "twice", "3 times".
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return strconv.Itoa(n) + " times"
}

// millis shows a duration in milliseconds with one decimal: "12.3 ms".
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
}
