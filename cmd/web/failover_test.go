package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/pgcluster"
	"github.com/idemlab/idemlab/internal/testdb"
)

// failoverFigures is what one replication setting showed in
// TestFailoverWindow.
type failoverFigures struct {
	acknowledged, lost, twice, caughtByKey, caughtByIdentity int
	perCancel, perCommit                                     time.Duration
}

// The failover window of docs/scaling.md: the same schedule of keyed
// cancellations on a primary with a streaming standby, once asynchronous,
// once with the standby synchronous. The standby is cut off (a lagging
// standby: the async window made wide enough to see), three more
// cancellations are sent, the primary is killed and the standby promoted.
// The app runs on a multi-host DATABASE_URL with
// target_session_attrs=read-write: while no primary answers every route
// says 503 database-unavailable with Retry-After, and afterwards the same
// process carries on with the new primary. The client then sends every key
// again, as a client that never saw its answer would.
//
// Async: the acknowledged cancellations of the cut-off stretch lose their
// stored answer, and their retries execute again. Sync: the three are never
// acknowledged (their commits wait for the standby), nothing acknowledged is
// lost and nothing runs twice. The provider keeps its own database, as a
// real one would: its effects ledger survives the app's failover.
func TestFailoverWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL clusters per replication setting")
	}
	t.Parallel()
	var mu sync.Mutex
	figures := map[string]failoverFigures{}
	t.Cleanup(func() {
		a, s := figures["async"], figures["sync"]
		if a.perCancel > 0 && s.perCancel > 0 {
			t.Logf("synchronous standby: %.2f× per cancellation (%s vs %s), %.2f× per commit (%s vs %s)",
				float64(s.perCancel)/float64(a.perCancel), s.perCancel, a.perCancel,
				float64(s.perCommit)/float64(a.perCommit), s.perCommit, a.perCommit)
		}
	})
	for _, mode := range []string{"async", "sync"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := failoverRun(t, mode == "sync")
			mu.Lock()
			figures[mode] = f
			mu.Unlock()
			t.Logf("%s: %d acknowledged, %d lost answers, %d executed twice (%d caught by the provider's key, %d by the business identity)",
				mode, f.acknowledged, f.lost, f.twice, f.caughtByKey, f.caughtByIdentity)
			switch {
			case mode == "sync" && (f.lost != 0 || f.twice != 0):
				t.Fatalf("synchronous standby: %d lost, %d executed twice; want none", f.lost, f.twice)
			case mode == "async" && f.lost == 0:
				t.Fatalf("asynchronous standby cut off: no acknowledged answer lost; the window is not shown")
			}
		})
	}
}

func failoverRun(t *testing.T, synchronous bool) failoverFigures {
	const before, during = 8, 3 // cancellations before the cut, and while the standby is cut off
	ctx := context.Background()
	var settings map[string]string
	if synchronous {
		settings = pgcluster.Synchronous
	}
	primary := pgcluster.ForTest(t, pgcluster.Options{Settings: settings})
	standby := pgcluster.StandbyForTest(t, primary, pgcluster.Options{})
	provDB := testdb.New(t) // the provider's own database, away from the failover
	_, provURL := externalProvider(t, provDB)
	name := privateDatabase(t, primary)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port(), name)
	s := startServerOn(t, provDB, map[string]string{
		"DATABASE_URL": url, "PROVIDER_URL": provURL, "DB_MAX_CONNS": "4",
		"RATE_LIMIT_WRITES_PER_USER": "off", "RECOVERY_INTERVAL": "200ms",
	})

	var f failoverFigures
	conn, err := pgx.Connect(ctx, primary.URLFor(name))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	f.perCommit = commitLatency(t, conn)
	policies := failoverPolicies(t, conn, before+during)
	cancel := func(i int) response {
		return doWith(t, noRedirectClient(nil), s.URL, request{Method: "POST", Token: "demo-alice",
			Path:   fmt.Sprintf("/api/v1/policies/%d/cancel", policies[i]),
			Header: map[string]string{"Idempotency-Key": fmt.Sprintf("failover-%d", i)}})
	}

	// 1. Cancellations while the standby keeps up: their figures are the
	// cost of each setting.
	const warmUp = 2 // the pool's connections and the statements' descriptions
	var start time.Time
	for i := range before {
		if i == warmUp {
			start = time.Now()
		}
		if r := cancel(i); r.Status != 200 {
			t.Fatalf("cancellation %d: %d %s", i, r.Status, r.Body)
		}
	}
	f.perCancel = time.Since(start) / (before - warmUp)
	f.acknowledged = before

	// 2. The standby cut off; three more cancellations; the primary killed.
	if err := standby.CaughtUp(primary); err != nil {
		t.Fatal(err)
	}
	if err := standby.PauseStreaming(); err != nil {
		t.Fatal(err)
	}
	answers := make([]response, before+during)
	var wg sync.WaitGroup
	for i := before; i < before+during; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = cancel(i)
		}()
	}
	time.Sleep(1500 * time.Millisecond) // async: answered; sync: waiting at a commit
	if err := primary.Stop(true); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := before; i < before+during; i++ {
		switch answers[i].Status {
		case 200:
			f.acknowledged++
		case 503:
		default:
			t.Fatalf("cancellation %d at the primary's death: %d %s", i, answers[i].Status, answers[i].Body)
		}
	}

	// 3. No primary: every route says so, and when to come back.
	for _, req := range []request{
		{Method: "GET", Path: "/api/v1/policies", Token: "demo-alice"},
		{Method: "POST", Path: fmt.Sprintf("/api/v1/policies/%d/cancel", policies[0]), Token: "demo-alice",
			Header: map[string]string{"Idempotency-Key": "failover-0"}},
	} {
		r := s.do(req)
		if r.Status != 503 || r.problemType() != "database-unavailable" || r.Header.Get("Retry-After") == "" {
			t.Fatalf("%s %s without a primary: %d %s (Retry-After %q), want 503 database-unavailable with Retry-After",
				req.Method, req.Path, r.Status, r.Body, r.Header.Get("Retry-After"))
		}
	}

	// 4. The standby promoted: the same process carries on, and the client
	// sends every key again.
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	for i := range before + during {
		var r response
		waitUntil(t, 30*time.Second, func() bool {
			r = cancel(i)
			return r.Status != 503 && !(r.Status == 409 && r.problemType() == "request-in-progress")
		})
		replayed := r.Header.Get("Idempotent-Replayed") == "true"
		acknowledged := i < before || answers[i].Status == 200
		switch {
		case r.Status == 409:
			f.caughtByIdentity++ // the business identity: one cancellation per policy
		case r.Status != 200:
			t.Fatalf("retry of cancellation %d after the failover: %d %s", i, r.Status, r.Body)
		case acknowledged && !replayed:
			f.lost++ // the stored answer is gone: the retry executed again
		}
		var effects, attempts int
		provDB.Pool.QueryRow(ctx, `SELECT count(*) FROM fake_provider.effects WHERE policy_id = $1`, policies[i]).Scan(&effects)
		provDB.Pool.QueryRow(ctx, `SELECT coalesce(max(attempts), 0) FROM fake_provider.requests WHERE policy_id = $1`, policies[i]).Scan(&attempts)
		switch {
		case effects > 1:
			f.twice++ // two effects at the provider: nobody caught it
		case attempts > 1:
			f.caughtByKey++ // sent twice, applied once: the provider's idempotency key
		}
	}
	return f
}

// failoverPolicies makes n active policies of alice's.
func failoverPolicies(t *testing.T, conn *pgx.Conn, n int) []int64 {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		INSERT INTO policies (user_id, number, holder, premium, coverage_start, coverage_end)
		SELECT u.id, 'POL-FAILOVER-' || g, 'Alice Failover', 120, current_date - 10, current_date + 355
		  FROM users u, generate_series(1, $1) g
		 WHERE u.name = 'alice'
		 ORDER BY g
		RETURNING id`, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) != n {
		t.Fatalf("policies: %v, %v", ids, err)
	}
	return ids
}

// commitLatency is the mean time of one small committed write on conn.
func commitLatency(t *testing.T, conn *pgx.Conn) time.Duration {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS failover_commits (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	const n = 100
	start := time.Now()
	for range n {
		if _, err := conn.Exec(ctx, `INSERT INTO failover_commits VALUES (now())`); err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start) / n
}

// privateDatabase creates a database of a random name on c: the events'
// stream and subject are named after the database, and the NATS server is
// shared by every test on this machine.
func privateDatabase(t *testing.T, c *pgcluster.Cluster) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("idemlab_%d", rand.Int64N(1e12))
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	return name
}
