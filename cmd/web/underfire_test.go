package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemlab/idemlab/internal/netfault"
	"github.com/idemlab/idemlab/internal/pgcluster"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/testdb"
)

// Regression tests for what a chaos run found (issue 11): a database that
// goes away under requests, an instance started before its database, and a
// request that loses its operation while it waits on the provider.

// serverOnCluster starts the app on a private PostgreSQL that the test may
// stop and start without disturbing anyone else.
func serverOnCluster(t *testing.T, c *pgcluster.Cluster, env map[string]string) *testServer {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return startServerOn(t, &testdb.DB{Name: "postgres", URL: c.URL(), Pool: pool}, env)
}

// While PostgreSQL is down every route answers 503 database-unavailable with
// Retry-After — the bearer-token lookup, reads, keyed writes, pages, the
// readiness probe — never a 500; when it is back, the same requests succeed
// and nothing was half written.
func TestDatabaseDownAnswers503ThenRecovers(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	s := serverOnCluster(t, c, nil)
	policy := s.policyOf(t, "demo-alice", 0)
	slot := freeSlot(t, s.DB, 0)

	requests := []request{
		{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"},
		{Method: "GET", Path: "/api/v1/slots", Token: "demo-bob"},
		cancelReq(policy, "demo-alice", "down-cancel", ""),
		{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", slot), Token: "demo-bob", Header: map[string]string{"Idempotency-Key": "down-book"}},
		{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"},
		{Method: "GET", Path: "/api/v1/recovery", Token: "demo-admin"},
	}
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	for _, req := range requests {
		r := s.do(req)
		if r.Status != http.StatusServiceUnavailable || r.problemType() != "database-unavailable" || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s with the database down: %d %v %s; want 503 database-unavailable with Retry-After",
				req.Method, req.Path, r.Status, r.Header, r.Body)
		}
	}
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the database down: %d %s", r.Status, r.Body)
	}
	if r := s.do(request{Method: "GET", Path: "/policies"}); r.Status != http.StatusSeeOther && r.Status != http.StatusServiceUnavailable {
		t.Errorf("a page with the database down: %d", r.Status)
	}

	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// The pool reconnects by itself; the keys of the refused requests were
	// never claimed, so the same keys now execute.
	waitFor(t, 20*time.Second, func() bool { return s.do(requests[0]).Status == http.StatusOK })
	// The cancellation executes: 200, or 202 when the provider — whose own
	// pool met the same restart — could not answer at once.
	if r := s.do(requests[2]); r.Status != http.StatusOK && r.Status != http.StatusAccepted {
		t.Errorf("cancel after the database is back: %d %s", r.Status, r.Body)
	}
	if r := s.do(requests[3]); r.Status != http.StatusCreated {
		t.Errorf("book after the database is back: %d %s", r.Status, r.Body)
	}
	s.DB.Pool.Reset() // the test's own connections died with the server
	s.assertInvariants(t)
}

// The database restarts (immediate: crash recovery) while requests are in
// flight: each answer is a success, a stored refusal or a 503 — never a 500.
func TestDatabaseRestartUnderRequestsIsNever500(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	s := serverOnCluster(t, c, map[string]string{"DB_MAX_CONNS": "8"})
	var (
		mu     sync.Mutex
		counts = map[int]int{}
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var req request
				if i%2 == 0 {
					req = request{Method: "GET", Path: "/api/v1/policies", Token: "demo-carol"}
				} else {
					req = request{Method: "POST", Path: fmt.Sprintf("/api/v1/slots/%d/book", 1+(w*1000+i)%150), Token: "demo-carol",
						Header: map[string]string{"Idempotency-Key": fmt.Sprintf("restart-%d-%d", w, i)}}
				}
				r := doWith(t, noRedirectClient(nil), s.URL, req)
				mu.Lock()
				counts[r.Status]++
				mu.Unlock()
				if r.Status >= 500 && r.problemType() != "database-unavailable" {
					t.Errorf("%s %s during a restart: %d %s", req.Method, req.Path, r.Status, r.Body)
				}
			}
		})
	}
	for range 2 {
		time.Sleep(500 * time.Millisecond)
		if err := c.Restart(true); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("answers by status: %v", counts)
	if counts[http.StatusServiceUnavailable] == 0 {
		t.Errorf("no request saw the database away (%v): the restarts were not exercised", counts)
	}
	waitFor(t, 20*time.Second, func() bool {
		return s.do(request{Method: "GET", Path: "/api/v1/policies", Token: "demo-carol"}).Status == http.StatusOK
	})
	s.DB.Pool.Reset() // the test's own connections died with the server
	s.assertInvariants(t)
}

// `web serve` started while its database is down waits for it (logged,
// with backoff) and comes up when it returns, instead of exiting.
func TestServeStartedBeforeItsDatabaseWaits(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(2 * time.Second)
		if err := c.Start(); err != nil {
			t.Error(err)
		}
	}()
	s := serverOnCluster(t, c, nil) // returns once the server listens
	if r := s.do(request{Method: "GET", Path: "/readyz"}); r.Status != http.StatusOK {
		t.Fatalf("/readyz after the database came up: %d %s", r.Status, r.Body)
	}
}

// A request whose provider answer arrives after its operation lease ran out
// loses the operation to recovery on the other instance. It answers nothing
// of its own — no "lease lost" — and nothing of the kind is stored: its
// client and every retry end with the cancellation's real outcome.
func TestARequestThatLostItsOperationAnswersTheOutcome(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	_, provURL := externalProvider(t, db)
	proxy, err := netfault.Listen(strings.TrimPrefix(provURL, "http://"), netfault.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.SetDelay(0, 3*time.Second) // the provider's answer comes back after the 1 s lease
	env := map[string]string{
		"PROVIDER_URL":     proxy.URL(),
		"PROVIDER_TIMEOUT": "6s",
		"OPERATION_LEASE":  "1s",
	}
	a := startServerOn(t, db, merge(env, map[string]string{"RECOVERY_INTERVAL": "1h"}))
	startServerOn(t, db, merge(env, map[string]string{"RECOVERY_INTERVAL": "100ms"})) // takes the operation over

	policy := a.policyOf(t, "demo-alice", 0)
	first := a.do(cancelReq(policy, "demo-alice", "lost-op", ""))
	t.Logf("the request that lost its operation answered %d %s", first.Status, first.Body)
	if first.problemType() == "lease-lost" || first.Status >= 500 {
		t.Fatalf("the request that lost its operation answered %d %s", first.Status, first.Body)
	}
	proxy.SetDelay(0, 0)
	// The client retries with the same key until the key holds an answer:
	// the operation's state when the retry took the key over (200, or 202
	// while recovery is still at it), replayed from then on.
	var answer response
	waitFor(t, 30*time.Second, func() bool {
		answer = a.do(cancelReq(policy, "demo-alice", "lost-op", ""))
		return answer.Status == http.StatusOK || answer.Status == http.StatusAccepted
	})
	if again := a.do(cancelReq(policy, "demo-alice", "lost-op", "")); again.Header.Get("Idempotent-Replayed") != "true" ||
		string(again.Body) != string(answer.Body) {
		t.Errorf("the key's answer does not replay: %d %s then %d %s", answer.Status, answer.Body, again.Status, again.Body)
	}
	var op operationJSON
	answer.JSON(t, &op)
	waitFor(t, 30*time.Second, func() bool {
		var now operationJSON
		a.do(request{Method: "GET", Path: fmt.Sprintf("/api/v1/operations/%d", op.ID), Token: "demo-alice"}).JSON(t, &now)
		return now.Status == "SUCCEEDED"
	})
	var lost int
	db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE convert_from(response_body, 'UTF8') LIKE '%lease-lost%'`).Scan(&lost)
	if lost != 0 {
		t.Errorf("%d keys store a lease-lost answer", lost)
	}
	if n := a.effects(t, policy); n != 1 {
		t.Errorf("provider effects = %d, want 1", n)
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s", d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An operator's "not idempotent", said at run time, outlives the restart of
// a replica started with PROVIDER_IDEMPOTENT_CALLS=true: the belief is one
// row for the fleet, and a long chaos run found 23 policies cancelled twice
// because a restarted instance seeded it back to "idempotent" and recovery
// then resent unknown calls blind. A start's "not idempotent" is applied
// over a person's "idempotent" (the cautious word from anywhere), and a
// start's word replaces an earlier start's.
func TestARestartKeepsAPersonsBelief(t *testing.T) {
	t.Parallel()
	believes := func(s *testServer) (bool, string) {
		t.Helper()
		r := s.do(request{Method: "GET", Path: "/api/v1/admin/systems", Token: "demo-admin"})
		var list struct {
			Items []struct {
				Name       string `json:"name"`
				Idempotent bool   `json:"believed_idempotent"`
				UpdatedBy  string `json:"updated_by"`
			} `json:"items"`
		}
		r.JSON(t, &list)
		for _, b := range list.Items {
			if b.Name == "provider" {
				return b.Idempotent, b.UpdatedBy
			}
		}
		t.Fatalf("no belief about the provider: %s", r.Body)
		return false, ""
	}
	say := func(s *testServer, idempotent bool) {
		t.Helper()
		body := fmt.Sprintf(`{"believed_idempotent":%t}`, idempotent)
		if r := s.do(request{Method: "PUT", Path: "/api/v1/admin/systems/provider", Token: "demo-admin", Body: body}); r.Status != http.StatusOK {
			t.Fatalf("PUT belief: %d %s", r.Status, r.Body)
		}
	}
	start := func(db *testdb.DB, instance, idempotent string) *testServer {
		return startServerOn(t, db, map[string]string{"INSTANCE_ID": instance, "PROVIDER_IDEMPOTENT_CALLS": idempotent})
	}

	first := start(testdb.New(t), "app-1", "true")
	say(first, false)
	again := start(first.DB, "app-2", "true") // a replica restarted
	if idem, by := believes(again); idem {
		t.Fatalf("after a replica's restart the app believes the provider idempotent (set by %s); the operator said it is not", by)
	}

	say(first, true)
	start(first.DB, "app-3", "false")
	if idem, by := believes(first); idem {
		t.Fatalf("a start with PROVIDER_IDEMPOTENT_CALLS=false left the belief idempotent (set by %s)", by)
	}
	start(first.DB, "app-4", "true") // the last word was a start's: this one replaces it
	if idem, by := believes(first); !idem || !strings.Contains(by, "app-4") {
		t.Fatalf("a start's word over an earlier start's: idempotent=%t set by %s; want true by app-4", idem, by)
	}
}

// The steps of a start after its migration — the demo data, the beliefs —
// wait for a database that went away between them, as the migration does,
// instead of ending the process: a chaos run saw `web serve` exit with
// "conn closed" when a restart landed just after its migration.
func TestAStartWaitsForADatabaseThatLeftAfterItsMigration(t *testing.T) {
	t.Parallel()
	c := pgcluster.ForTest(t, pgcluster.Options{})
	env := map[string]string{"DATABASE_URL": c.URL(), "DEMO_MODE": "true", "INSTANCE_ID": "app-1", "PROVIDER_IDEMPOTENT_CALLS": "false"}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(testLogWriter{t}, nil))
	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()

	if err := c.Stop(true); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(time.Second)
		if err := c.Start(); err != nil {
			t.Error(err)
		}
	}()
	beliefs := make(chan error, 1)
	go func() { beliefs <- seedBeliefs(ctx, cfg, pool, logger) }()
	if accounts, err := seedDemo(ctx, cfg, pool, logger); err != nil || len(accounts) == 0 {
		t.Fatalf("the demo data with the database away for a second: %d accounts, %v", len(accounts), err)
	}
	if err := <-beliefs; err != nil {
		t.Fatalf("the beliefs with the database away for a second: %v", err)
	}
	if b, err := recovery.ReadBelief(ctx, pool, "provider"); err != nil || b.Idempotent {
		t.Fatalf("belief after the seed: %+v %v; want not idempotent", b, err)
	}
}
