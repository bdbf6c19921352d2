package labs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/idempotency"
)

// Lab 1: where the idempotency state lives. A key kept in Redis is written
// in a different system from the business change it guards, so there is
// always a moment when one is durable and the other is not. PostgreSQL keeps
// the key next to the change and commits them together.
var redisLab = &Lab{
	Number: 1,
	Needs:  "Redis (REDIS_URL); its restart part also starts a private redis-server",
	Name:   "redis",
	Title:  "Redis or PostgreSQL for idempotency state",
	Summary: "Request keys kept in Redis, written apart from the change they guard: a crash between the two, or " +
		"a Redis restart under a claim, runs the work twice. Kept in PostgreSQL, committed with the change, the " +
		"key replays the answer.",
	Lesson: "A cancellation claims its request key, records the intent, cancels at the provider and commits the " +
		"outcome. With the key in Redis (SET NX PX to claim, the answer written after the PostgreSQL commit), a crash " +
		"between that commit and the Redis write leaves a claim that simply expires: the retry finds no key and runs " +
		"the work again — a second operation and a second provider effect, unless UNIQUE(policy_id, operation_type) " +
		"refuses the second operation, and even then the retry is told duplicate-intent instead of its own answer. " +
		"The claim has its own window too: Redis restarted without persistence forgets a claim in flight, and a " +
		"duplicate executes beside the original. With the key in PostgreSQL (idempotency.Store: the claim in the " +
		"intent's transaction, the answer in the outcome's), the same crash and the same duplicate find the key and " +
		"replay: one effect, with or without the constraint.",
	Columns: []Column{
		colExecutions, colEffects, colDuplicates,
		{Key: "refused", Label: "stopped by UNIQUE(policy_id, operation_type)"},
		{Key: "lost", Label: "repeats not told their request's answer", Bad: true},
	},
	Code: []CodeRef{
		{Path: "internal/labs/redis.go", Text: "// tx 2: the outcome — the business commit — and, in PostgreSQL, the answer.",
			Says: "the outcome commits in PostgreSQL …"},
		{Path: "internal/labs/redis.go", Text: "if crashAt == redisCompleteAt {",
			Says: "… and the crash point sits before the Redis write that would record the answer"},
		{Path: "internal/labs/redis.go", Text: "return s.owner.Complete(ctx, tx, idempotency.Response{Status: 200, Body: []byte(answer)})",
			Says: "with the key in PostgreSQL, the answer commits with the outcome: there is no between"},
		{Path: "internal/labs/redis.go", Text: "return s.rdb.Set(ctx, s.keyOf(requestKey), completedPrefix+answer, time.Hour).Err()",
			Says: "the answer, written to Redis after the PostgreSQL commit: a dual write"},
		{Path: "internal/labs/redis.go", Text: "ok, err := s.rdb.SetNX(ctx, key, inProgress, s.lease).Result()",
			Says: "SET NX PX: the claim lives in Redis's memory only"},
	},
	run: runRedis,
}

// Durations of the Redis lab: the lease a crashed claim expires after (the
// retry waits it out), and the provider call's timeout.
const (
	redisLease      = 300 * time.Millisecond
	redisLongLease  = 30 * time.Second // the restart part: the claim must not expire on its own
	redisCallTimout = 2 * time.Second
	retryEvery      = 50 * time.Millisecond // the client's pause after a 409
)

// The lab's crash point: after the business commit, before the answer is
// recorded.
const redisCompleteAt labCrash = "after_business_commit"

func runRedis(ctx context.Context, e *env) ([]Variant, error) {
	rdb := e.redis
	if err := rdb.Ping(ctx).Err(); err != nil {
		// Nothing at REDIS_URL (a bare machine): the lab runs on a private
		// redis-server of its own, its keys gone with it when the run ends.
		if _, missing := exec.LookPath(e.cfg.RedisServer); missing != nil {
			// The cause names the host: the log has it, the reader the variable.
			e.cfg.Logger.Warn("labs: the Redis lab has no Redis", "run", e.run, "err", err, "redis_server", e.cfg.RedisServer)
			return nil, fmt.Errorf("%w: Redis does not answer at REDIS_URL, and there is no %s to start a private one: "+
				"install it (Debian: apt-get install redis-server) or set REDIS_URL to a Redis that answers", ErrUnavailable, e.cfg.RedisServer)
		}
		private, err := startPrivateRedis(ctx, e.cfg.RedisServer)
		if err != nil {
			return nil, err
		}
		e.cfg.Logger.Info("labs: nothing answers at REDIS_URL: the Redis lab runs on a private redis-server", "port", private.port)
		defer func() {
			private.close()
			e.mu.Lock()
			e.redisKeys = nil // nothing left to delete
			e.mu.Unlock()
		}()
		rdb = private.client
	}
	sys, err := e.system(systemLabs)
	if err != nil {
		return nil, err
	}
	type spec struct {
		name, title string
		broken      bool
		store       func() keyStore
		constrained bool
	}
	redisStore := func() keyStore { return brokenRedisStore{rdb: rdb, lease: redisLease, keyOf: e.redisKey} }
	pgStore := pgKeys(idempotency.NewStore(e.lab, redisLease, time.Hour), e.user)
	var out []Variant
	for _, s := range []spec{
		{"redis", "Redis keys, crash after the commit", true, redisStore, false},
		{"redis-unique", "Redis keys, crash after the commit, with UNIQUE(policy_id, operation_type)", true, redisStore, true},
		{"postgres", "PostgreSQL keys, the same crash", false, pgStore, false},
		{"postgres-unique", "PostgreSQL keys, the same crash, with UNIQUE(policy_id, operation_type)", false, pgStore, true},
	} {
		v, err := e.crashAndRetry(ctx, sys, s.name, s.store, s.constrained)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		v.Title, v.Broken = s.title, s.broken
		out = append(out, v)
	}

	restarted, err := e.restartUnderClaim(ctx, sys)
	if err != nil {
		return nil, err
	}
	held, err := e.duplicateUnderClaim(ctx, sys, "postgres-in-flight",
		pgKeys(idempotency.NewStore(e.lab, redisLongLease, time.Hour), e.user), nil)
	if err != nil {
		return nil, err
	}
	held.Title = "PostgreSQL keys, a duplicate while the claim is in flight"
	return append(out, restarted, held), nil
}

// crashAndRetry runs one request that crashes at redisCompleteAt, then its
// client's retries with the same key until one gets a final answer.
func (e *env) crashAndRetry(ctx context.Context, sys *fakeSystem, variant string, ks func() keyStore, constrained bool) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Counts: map[string]int{}}
	subject, err := e.subject(ctx)
	if err != nil {
		return v, err
	}
	c := &cancellation{e: e, sys: sys, t: t, variant: variant, subject: subject, constrained: constrained,
		keys: ks, key: e.name("redis", variant, "request")}
	first, err := c.attempt(ctx, "request", redisCompleteAt)
	if !errors.Is(err, errCrashed) {
		return v, fmt.Errorf("the first attempt should have crashed, answered %q (%v)", first, err)
	}
	if ks().inTx() {
		t.say("request", "crashed after the business commit, before answering: the answer is already stored, in that commit")
	} else {
		t.wrong("request", "crashed after the business commit, before writing its answer to Redis: the answer was never recorded")
	}
	answer, err := c.retryUntilAnswered(ctx, "retry")
	if err != nil {
		return v, err
	}
	return c.tally(ctx, v, hearing{who: "retry", whose: "the client's retry of the request that crashed",
		repeats: "the request that crashed", answer: answer})
}

// restartUnderClaim: request A claims its key in a private Redis, records
// its intent and is in flight; Redis restarts without persistence; the
// duplicate B finds no key and executes; then A goes on.
func (e *env) restartUnderClaim(ctx context.Context, sys *fakeSystem) (Variant, error) {
	const variant = "redis-restart"
	title := "Redis keys, Redis restarted (no persistence) while a claim is in flight"
	if _, err := exec.LookPath(e.cfg.RedisServer); err != nil {
		return Variant{Name: variant, Title: title, Broken: true, Counts: map[string]int{},
			NotRun: fmt.Sprintf("this part starts a private redis-server (REDIS_SERVER=%s), which is not installed here", e.cfg.RedisServer)}, nil
	}
	private, err := startPrivateRedis(ctx, e.cfg.RedisServer)
	if err != nil {
		return Variant{}, err
	}
	defer private.close()
	v, err := e.duplicateUnderClaim(ctx, sys, variant, func() keyStore {
		return brokenRedisStore{rdb: private.client, lease: redisLongLease, keyOf: e.redisKey}
	},
		func(t *timeline) error {
			if err := private.restart(ctx); err != nil {
				return err
			}
			t.wrong("redis", "restarted without persistence (--save '' --appendonly no): every key is gone, A's claim with them")
			return nil
		})
	v.Title, v.Broken = title, true
	return v, err
}

// duplicateUnderClaim: A claims and records its intent, then stalls before
// its provider call; meanwhile (after disturb, when given) the duplicate B
// arrives with the same key; then A goes on, and B retries until answered.
func (e *env) duplicateUnderClaim(ctx context.Context, sys *fakeSystem, variant string, ks func() keyStore, disturb func(*timeline) error) (Variant, error) {
	t := newTimeline()
	v := Variant{Name: variant, Counts: map[string]int{}}
	subject, err := e.subject(ctx)
	if err != nil {
		return v, err
	}
	c := &cancellation{e: e, sys: sys, t: t, variant: variant, subject: subject, keys: ks, key: e.name("redis", variant, "request")}

	inFlight, goOn := make(chan struct{}), make(chan struct{})
	c.beforeCall = func(actor string) {
		if actor == "A" {
			close(inFlight) // A has claimed and committed its intent
			<-goOn          // … and stays in flight until B has had its go
		}
	}
	type answered struct {
		answer string
		err    error
	}
	aDone := make(chan answered, 1)
	go func() {
		a, err := c.attempt(ctx, "A", "")
		aDone <- answered{a, err}
	}()
	select {
	case <-inFlight:
	case a := <-aDone:
		//lint:ignore ST1005 "A" is the name of the lab's first request, shown as is
		return v, fmt.Errorf("A ended before its call: %q %v", a.answer, a.err)
	}
	t.say("A", "is in flight: claim and intent committed, provider call not answered yet")
	if disturb != nil {
		if err := disturb(t); err != nil {
			close(goOn)
			<-aDone
			return v, err
		}
	}
	b, err := c.attempt(ctx, "B", "")
	close(goOn)
	a := <-aDone
	if err != nil && !errors.Is(err, errInProgress) {
		return v, err
	}
	if a.err != nil {
		return v, a.err
	}
	if errors.Is(err, errInProgress) {
		if b, err = c.retryUntilAnswered(ctx, "B"); err != nil {
			return v, err
		}
	}
	t.say("A", "its client was answered %q", a.answer)
	return c.tally(ctx, v, hearing{who: "B", whose: "B, A's duplicate under the same key,", repeats: "A", answer: b})
}

// keyStore is where a request's key, its claim and its answer live.
type keyStore interface {
	// claim makes the caller the key's owner in tx (the intent's
	// transaction, for PostgreSQL), or reports the answer the key holds
	// ("" while it is in progress: errInProgress).
	claim(ctx context.Context, tx pgx.Tx, key string) (answer string, err error)
	// complete records the answer: in tx for PostgreSQL; Redis ignores tx
	// and is called after the commit.
	complete(ctx context.Context, tx pgx.Tx, key, answer string) error
	// inTx reports whether complete joins the outcome's transaction.
	inTx() bool
}

// errInProgress: the key is claimed by a request still running; try later.
var errInProgress = errors.New("labs: 409 request in progress")

// brokenRedisStore keeps request keys in Redis: claim with SET NX PX, the
// answer written after the business commit — a dual write, and the lab's
// point. Its claim lives in Redis's memory only.
type brokenRedisStore struct {
	rdb   *redis.Client
	lease time.Duration
	// keyOf names the Redis key of a request key (the labs' prefix, the run).
	keyOf func(requestKey string) string
}

const (
	inProgress      = "IN_PROGRESS"
	completedPrefix = "COMPLETED:"
)

func (s brokenRedisStore) claim(ctx context.Context, _ pgx.Tx, requestKey string) (string, error) {
	key := s.keyOf(requestKey)
	got, err := s.rdb.Get(ctx, key).Result()
	switch {
	case err == nil && strings.HasPrefix(got, completedPrefix):
		return strings.TrimPrefix(got, completedPrefix), nil // a replay
	case err == nil:
		return "", errInProgress
	case !errors.Is(err, redis.Nil):
		return "", err
	}
	// No key: claim it for the lease. NX: only if nobody set it meanwhile.
	ok, err := s.rdb.SetNX(ctx, key, inProgress, s.lease).Result()
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errInProgress
	}
	return "", nil
}

func (s brokenRedisStore) complete(ctx context.Context, _ pgx.Tx, requestKey, answer string) error {
	return s.rdb.Set(ctx, s.keyOf(requestKey), completedPrefix+answer, time.Hour).Err()
}

func (brokenRedisStore) inTx() bool { return false }

// pgKeyStore is the app's key store, idempotency.Store, on the labs schema.
type pgKeyStore struct {
	store *idempotency.Store
	user  int64
	owner *idempotency.Claim // the claim this attempt holds
}

func (s *pgKeyStore) claim(ctx context.Context, tx pgx.Tx, key string) (string, error) {
	fp := fingerprintOf("redis", key)
	c, err := s.store.Claim(ctx, tx, s.user, key, fp)
	if err == nil && c == nil {
		c, err = s.store.TakeOver(ctx, tx, s.user, key, fp)
	}
	if err != nil {
		return "", err
	}
	if c != nil {
		s.owner = c
		return "", nil
	}
	rec, err := s.store.Lookup(ctx, s.user, key)
	if err != nil {
		return "", err
	}
	if rec.Status == idempotency.StatusCompleted {
		return string(rec.Response.Body), nil // a replay
	}
	return "", errInProgress
}

func (s *pgKeyStore) complete(ctx context.Context, tx pgx.Tx, _, answer string) error {
	return s.owner.Complete(ctx, tx, idempotency.Response{Status: 200, Body: []byte(answer)})
}

func (*pgKeyStore) inTx() bool { return true }

// pgKeys gives each attempt a key store of its own over one Store: the claim
// an attempt holds is its own.
func pgKeys(store *idempotency.Store, user int64) func() keyStore {
	return func() keyStore { return &pgKeyStore{store: store, user: user} }
}

// cancellation is the lab's cancellation of one policy (a fake-system
// subject): claim the key, record the intent (an operation), call the
// provider under the operation's step key, commit the outcome, record the
// answer.
type cancellation struct {
	e           *env
	sys         *fakeSystem
	t           *timeline
	variant     string
	subject     int64
	constrained bool
	// keys gives each attempt its key store: each attempt is a fresh
	// process, holding nothing of an earlier one.
	keys func() keyStore
	key  string
	// beforeCall, when set, runs just before the provider call: the
	// schedule's hook to hold an attempt in flight.
	beforeCall func(actor string)
	// db holds the keys and the operations: the labs' pool when nil (the
	// failover lab's is a private primary with its standby).
	db *pgxpool.Pool
	// providerKey, when set, makes the provider call's key; otherwise it is
	// the operation's step key, as the app's (workflow.StepKey).
	providerKey func(opID int64) string
}

// pool is where the cancellation's keys and operations live.
func (c *cancellation) pool() *pgxpool.Pool {
	if c.db != nil {
		return c.db
	}
	return c.e.lab
}

// table is the operations table the variant writes: with the business
// constraint or without it.
func (c *cancellation) table() string {
	if c.constrained {
		return "operations"
	}
	return "operations_without_unique"
}

// attempt runs the request once, as actor; crashAt stops it at that point.
func (c *cancellation) attempt(ctx context.Context, actor string, crashAt labCrash) (string, error) {
	ks := c.keys()
	var opID int64
	var answer string
	refused := false
	// tx 1: the claim (for PostgreSQL) and the intent.
	err := pgx.BeginFunc(ctx, c.pool(), func(tx pgx.Tx) error {
		replay, err := ks.claim(ctx, tx, c.key)
		if err != nil || replay != "" {
			answer = replay
			return err
		}
		c.t.say(actor, "claimed the key")
		err = tx.QueryRow(ctx, `
			INSERT INTO `+c.table()+` (run_id, variant, policy_id, operation_type)
			VALUES ($1, $2, $3, 'CANCEL')
			    ON CONFLICT DO NOTHING -- 0 rows: the business constraint, where there is one
			RETURNING id`, c.e.run, c.variant, c.subject).Scan(&opID)
		if errors.Is(err, pgx.ErrNoRows) {
			// UNIQUE(policy_id, operation_type): this policy already has a cancellation.
			refused, answer = true, "409 duplicate-intent: the policy already has a cancellation"
			if ks.inTx() {
				return ks.complete(ctx, tx, c.key, answer)
			}
			return nil
		}
		return err
	})
	switch {
	case errors.Is(err, errInProgress):
		c.t.say(actor, "the key is claimed and in progress: 409, try again later")
		return "", err
	case err != nil:
		return "", err
	case answer != "" && !refused:
		c.t.say(actor, "the key holds an answer: replayed %q", answer)
		return answer, nil
	case refused:
		c.t.say(actor, "UNIQUE(policy_id, operation_type) refused a second operation: %s", answer)
		if !ks.inTx() {
			if err := ks.complete(ctx, nil, c.key, answer); err != nil {
				return "", err
			}
		}
		return answer, nil
	}
	c.t.say(actor, "recorded the intent: operation %d", opID)

	if c.beforeCall != nil {
		c.beforeCall(actor)
	}
	// The provider call, under the operation's step key: a second operation
	// is a second key, so even an idempotent provider applies it again.
	stepKey := fmt.Sprintf("%s-op-%d:provider_cancel", c.e.name("redis", c.variant), opID)
	if c.providerKey != nil {
		stepKey = c.providerKey(opID)
	}
	res, err := c.sys.client(redisCallTimout).Send(ctx, external.Call{
		Path: callsPath, Key: stepKey, Body: callBody{SubjectID: c.subject, What: "cancel"}})
	if err != nil {
		return "", err
	}
	if res.Outcome != external.Confirmed {
		return "", fmt.Errorf("the provider did not confirm %s: %v", stepKey, res.Err)
	}
	c.t.say(actor, "the provider cancelled the policy (key %s)", stepKey)

	// tx 2: the outcome — the business commit — and, in PostgreSQL, the answer.
	answer = fmt.Sprintf("200 cancelled by operation %d", opID)
	err = pgx.BeginFunc(ctx, c.pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE `+c.table()+` SET status = 'SUCCEEDED' WHERE id = $1`, opID); err != nil {
			return err
		}
		if ks.inTx() {
			return ks.complete(ctx, tx, c.key, answer)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	c.t.say(actor, "committed the outcome (the business commit)")
	if ks.inTx() {
		c.t.say(actor, "… and the answer with it, in the same commit")
	}
	if crashAt == redisCompleteAt {
		return "", errCrashed
	}
	if !ks.inTx() {
		if err := ks.complete(ctx, nil, c.key, answer); err != nil {
			return "", err
		}
		c.t.say(actor, "wrote the answer to Redis")
	}
	return answer, nil
}

// retryUntilAnswered is the client: it sends the same request with the
// same key until the answer is final (409 in progress is not), every
// retryEvery, bounded.
func (c *cancellation) retryUntilAnswered(ctx context.Context, actor string) (string, error) {
	var answer string
	err := pollEvery(ctx, 10*time.Second, retryEvery, func() (bool, error) {
		var err error
		answer, err = c.attempt(ctx, actor, "")
		if errors.Is(err, errInProgress) {
			return false, nil
		}
		return err == nil, err
	})
	return answer, err
}

// hearing is the answer one client got for a request key another request
// used first: who heard it (the timeline's actor), in words, and the request
// whose answer it should have been.
type hearing struct {
	who     string // "retry", "B"
	whose   string // "the client's retry of the request that crashed"
	repeats string // "the request that crashed", "A"
	answer  string
}

// tally counts what the variant did: operations started, provider effects,
// refusals, and whether h heard the first request's answer.
func (c *cancellation) tally(ctx context.Context, v Variant, h hearing) (Variant, error) {
	lastAnswer := h.answer
	var ops, refusedOps int
	err := c.e.lab.QueryRow(ctx, `
		SELECT count(*)
		  FROM `+c.table()+`
		 WHERE run_id = $1
		   AND variant = $2`, c.e.run, c.variant).Scan(&ops)
	if err != nil {
		return v, err
	}
	effects, err := c.e.effectsOf(ctx, c.subject, "")
	if err != nil {
		return v, err
	}
	if strings.HasPrefix(lastAnswer, "409") {
		refusedOps = 1
	}
	v.Counts["executions"] = ops + refusedOps
	v.Counts["effects"] = effects
	v.Counts["duplicates"] = max(0, effects-1)
	v.Counts["refused"] = refusedOps
	// The first operation's answer is what every retry should have heard.
	var firstOp int64
	if err := c.e.lab.QueryRow(ctx, `
		SELECT coalesce(min(id), 0)
		  FROM `+c.table()+`
		 WHERE run_id = $1
		   AND variant = $2`, c.e.run, c.variant).Scan(&firstOp); err != nil {
		return v, err
	}
	if first := fmt.Sprintf("200 cancelled by operation %d", firstOp); lastAnswer != first {
		v.Counts["lost"] = 1
		c.t.wrong(h.who, "its client was answered %q — but %s, whose key it repeats, had cancelled the policy as "+
			"operation %d: the client should have heard %q", lastAnswer, h.repeats, firstOp, first)
	}
	if v.Counts["duplicates"] > 0 {
		c.t.wrong("provider", "cancelled the policy %d times", effects)
	}
	v.Verdict = fmt.Sprintf("%s; %s heard %q", plural(effects, "provider effect"), h.whose, lastAnswer)
	v.Timeline = c.t.list()
	return v, nil
}

// privateRedis is a redis-server of the lab's own, without persistence, on
// a free loopback port: the one the lab restarts, so the shared Redis is
// never disturbed. It dies with this process (parent-death signal).
type privateRedis struct {
	bin    string
	port   int
	cmd    *exec.Cmd
	client *redis.Client
}

func startPrivateRedis(ctx context.Context, bin string) (*privateRedis, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p := &privateRedis{bin: bin, port: port}
	p.client = redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		DialTimeout: time.Second, MaxRetries: -1})
	if err := p.start(ctx); err != nil {
		p.client.Close()
		return nil, err
	}
	return p, nil
}

func (p *privateRedis) start(ctx context.Context) error {
	p.cmd = exec.Command(p.bin, "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("labs: start %s: %w", p.bin, err)
	}
	err := waitFor(ctx, 5*time.Second, func() (bool, error) { return p.client.Ping(ctx).Err() == nil, nil })
	if err != nil {
		p.stop()
		return fmt.Errorf("labs: the private redis-server did not answer: %w", err)
	}
	return nil
}

// restart kills the server (SIGKILL: no chance to save anything, and it was
// told to save nothing anyway) and starts it again on the same port.
func (p *privateRedis) restart(ctx context.Context) error {
	p.stop()
	return p.start(ctx)
}

func (p *privateRedis) stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

func (p *privateRedis) close() {
	p.stop()
	p.client.Close()
}
