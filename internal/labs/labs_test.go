package labs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/testdb"
	"github.com/idemlab/idemlab/internal/testenv"
	"github.com/idemlab/idemlab/internal/workflow"
)

// setup returns the labs over a fresh database, and a user to run them as.
func setup(t *testing.T) (*labs.Labs, *testdb.DB, int64) {
	t.Helper()
	db := testdb.New(t)
	l, err := labs.New(db.Pool, labs.Config{RedisPrefix: "idemlab:test:" + db.Name + ":"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	var user int64
	err = db.Pool.QueryRow(context.Background(), `
		INSERT INTO users (name, api_token_sha256)
		VALUES ('lab-tester', sha256('lab-tester'::bytea))
		RETURNING id`).Scan(&user)
	if err != nil {
		t.Fatal(err)
	}
	return l, db, user
}

// run runs the lab once and returns its variants by name.
func run(t *testing.T, l *labs.Labs, user int64, lab string) map[string]labs.Variant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := l.Run(ctx, labs.RunRequest{Lab: lab, UserID: user}, workflow.Hooks[labs.Run]{})
	if err != nil {
		t.Fatalf("%s: %v", lab, err)
	}
	out := map[string]labs.Variant{}
	for _, v := range r.Variants {
		out[v.Name] = v
	}
	return out
}

// want checks a variant's counts and whether its promise held.
func want(t *testing.T, v labs.Variant, held bool, counts map[string]int) {
	t.Helper()
	if v.NotRun != "" {
		t.Fatalf("%s did not run: %s", v.Name, v.NotRun)
	}
	for k, n := range counts {
		if v.Counts[k] != n {
			t.Errorf("%s: %s = %d, want %d (all: %v)\n%s", v.Name, k, v.Counts[k], n, v.Counts, timelineText(v))
		}
	}
	if v.Held != held {
		t.Errorf("%s: held = %t, want %t (%s)\n%s", v.Name, v.Held, held, v.Verdict, timelineText(v))
	}
}

func timelineText(v labs.Variant) string {
	var b strings.Builder
	for _, e := range v.Timeline {
		fmt.Fprintf(&b, "  %7.1f ms  %-10s %s\n", e.AtMS, e.Actor, e.What)
	}
	return b.String()
}

// Each lab runs more than once: the broken variant breaks every time, by
// schedule, and the correct one never does.
const repeats = 2

func TestRedisLabLosesTheAnswerAndPostgresDoesNot(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "redis")
		want(t, v["redis"], false, map[string]int{"executions": 2, "effects": 2, "duplicates": 1, "refused": 0, "lost": 1})
		want(t, v["redis-unique"], false, map[string]int{"executions": 2, "effects": 1, "duplicates": 0, "refused": 1, "lost": 1})
		want(t, v["postgres"], true, map[string]int{"executions": 1, "effects": 1, "duplicates": 0, "lost": 0})
		want(t, v["postgres-unique"], true, map[string]int{"executions": 1, "effects": 1, "duplicates": 0, "lost": 0})
		want(t, v["redis-restart"], false, map[string]int{"executions": 2, "effects": 2, "duplicates": 1})
		want(t, v["postgres-in-flight"], true, map[string]int{"executions": 1, "effects": 1, "duplicates": 0, "lost": 0})
	}
}

// The Redis lab says whose client heard the wrong answer, and what it should
// have heard (issue 29's second read, finding 6: the line was "client: was
// answered …, not what its request did", for a crashed request's retry and
// for a duplicate alike). Every variant that lost an answer names the
// request that heard it — the retry, or B — both answers and the operation
// the first request started; the verdict names who heard it.
func TestRedisLabSaysWhoHeardWhat(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	v := run(t, l, user, "redis")
	heard := regexp.MustCompile(`^its client was answered "([^"]+)" — but (the request that crashed|A), whose key it repeats, ` +
		`had cancelled the policy as operation (\d+): the client should have heard "200 cancelled by operation (\d+)"$`)
	for name, who := range map[string]string{"redis": "retry", "redis-unique": "retry", "redis-restart": "B"} {
		var lines int
		for _, e := range v[name].Timeline {
			if e.Actor == "client" {
				t.Errorf("%s: a line by an unnamed client: %s", name, e.What)
			}
			m := heard.FindStringSubmatch(e.What)
			if !e.Bad || m == nil {
				continue
			}
			lines++
			if e.Actor != who || m[3] != m[4] || strings.Contains(m[1], "operation "+m[3]) {
				t.Errorf("%s: %s %s", name, e.Actor, e.What)
			}
		}
		if lines != 1 {
			t.Errorf("%s: %d lines say who heard the wrong answer, want 1:\n%s", name, lines, timelineText(v[name]))
		}
		if whose := map[string]string{"retry": "the client's retry of the request that crashed heard", "B": "B, A's duplicate under the same key, heard"}[who]; !strings.Contains(v[name].Verdict, whose) {
			t.Errorf("%s: verdict %q does not say %q", name, v[name].Verdict, whose)
		}
	}
	for _, e := range v["redis-restart"].Timeline {
		if e.Actor == "A" && strings.HasPrefix(e.What, "its client was answered \"200 cancelled by operation ") {
			return
		}
	}
	t.Errorf("redis-restart does not say what A's client heard:\n%s", timelineText(v["redis-restart"]))
}

func TestFencingLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "fencing")
		want(t, v["broken"], false, map[string]int{"executions": 2, "effects": 2, "duplicates": 1, "lost": 1, "refused": 0})
		want(t, v["correct"], true, map[string]int{"executions": 2, "effects": 1, "duplicates": 0, "lost": 0, "refused": 1})
	}
}

func TestClaimLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "claim")
		want(t, v["broken"], false, map[string]int{"executions": 3, "effects": 3, "duplicates": 2, "refused": 0})
		want(t, v["correct"], true, map[string]int{"executions": 1, "effects": 1, "duplicates": 0, "refused": 2})
	}
}

func TestWebhooksLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "webhooks")
		want(t, v["blind"], false, map[string]int{"deliveries": 3, "effects": 3, "duplicates": 2, "backwards": 1, "refused": 0})
		want(t, v["no-fence"], false, map[string]int{"deliveries": 3, "effects": 2, "duplicates": 1, "backwards": 0, "refused": 2})
		want(t, v["no-monotonic"], false, map[string]int{"deliveries": 3, "effects": 1, "duplicates": 0, "backwards": 1, "refused": 2})
		want(t, v["correct"], true, map[string]int{"deliveries": 3, "effects": 1, "duplicates": 0, "backwards": 0, "refused": 3})
	}
}

func TestInboxLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "inbox")
		want(t, v["broken"], false, map[string]int{"executions": 3, "deliveries": 5, "effects": 2, "lost": 1, "duplicates": 0, "refused": 2})
		want(t, v["correct"], true, map[string]int{"executions": 3, "deliveries": 5, "effects": 3, "lost": 0, "duplicates": 0, "refused": 1})
	}
}

// The inbox lab's timeline names each message one way (m1, m2, m3) and counts
// each message's deliveries on: the repeated m1 is its delivery 2, and no
// (message, delivery) pair is told twice (issue 29, second read, finding 5).
func TestInboxLabNamesEachDeliveryOnce(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	delivery := regexp.MustCompile(`\b(m\d) delivery (\d+)\b`)
	for name, v := range run(t, l, user, "inbox") {
		seen := map[string]string{}
		for _, e := range v.Timeline {
			if strings.Contains(e.What, "lab:") {
				t.Errorf("%s: a line calls a message by its key, not m1/m2/m3: %q", name, e.What)
			}
			for _, m := range delivery.FindAllStringSubmatch(e.What, -1) {
				if earlier, ok := seen[m[0]]; ok {
					t.Errorf("%s: %q told twice:\n  %s\n  %s", name, m[0], earlier, e.What)
				}
				seen[m[0]] = e.What
			}
		}
		for _, must := range []string{"m1 delivery 1", "m1 delivery 2", "m2 delivery 1", "m2 delivery 2", "m3 delivery 1"} {
			if _, ok := seen[must]; !ok {
				t.Errorf("%s: no line tells %q; lines: %v", name, must, v.Timeline)
			}
		}
	}
}

func TestRelayLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "relay")
		want(t, v["broken"], false, map[string]int{"executions": 2, "effects": 1, "lost": 1, "duplicates": 0})
		want(t, v["correct"], true, map[string]int{"executions": 2, "effects": 2, "lost": 0, "duplicates": 0})
	}
}

func TestNullUniqueLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "null-unique")
		want(t, v["broken"], false, map[string]int{"executions": 4, "effects": 3, "duplicates": 2, "refused": 1})
		want(t, v["correct"], true, map[string]int{"executions": 4, "effects": 1, "duplicates": 0, "refused": 3})
	}
}

func TestCompensationLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "compensation")
		want(t, v["compensate-after"], false, map[string]int{"executions": 2, "charged": 1, "confirmed": 0, "released": 2, "paid_released": 1, "phantom_refunds": 0})
		want(t, v["compensate-before"], false, map[string]int{"executions": 2, "charged": 1, "confirmed": 0, "released": 2, "paid_released": 0, "phantom_refunds": 1})
		want(t, v["ask-first"], true, map[string]int{"executions": 2, "charged": 1, "confirmed": 1, "released": 1, "paid_released": 0, "phantom_refunds": 0})
	}
}

func TestBeliefLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "belief")
		want(t, v["broken"], false, map[string]int{"executions": 2, "effects": 2, "duplicates": 1, "refused": 0})
		want(t, v["correct"], true, map[string]int{"executions": 1, "effects": 1, "duplicates": 0, "refused": 1})
	}
}

func TestStatusLab(t *testing.T) {
	t.Parallel()
	l, _, user := setup(t)
	for range repeats {
		v := run(t, l, user, "status")
		want(t, v["broken"], false, map[string]int{"executions": 2, "effects": 2, "duplicates": 1, "refused": 0})
		want(t, v["correct"], true, map[string]int{"executions": 2, "effects": 1, "duplicates": 0, "refused": 1})
	}
}

// A run commits once: its result and nothing else of the scenario, whose
// scratch rows are gone; the user keeps the newest runs.
func TestARunLeavesItsResultAndNoScratch(t *testing.T) {
	t.Parallel()
	l, db, user := setup(t)
	ctx := context.Background()
	var begun, finished int
	r, err := l.Run(ctx, labs.RunRequest{Lab: "claim", UserID: user}, workflow.Hooks[labs.Run]{
		Begin:  func(context.Context, pgx.Tx) error { begun++; return nil },
		Finish: func(_ context.Context, _ pgx.Tx, r labs.Run, refusal error) error { finished++; return refusal },
	})
	if err != nil || begun != 1 || finished != 1 {
		t.Fatalf("run: %v, begin %d, finish %d", err, begun, finished)
	}
	got, err := l.Get(ctx, "claim", r.ID, user, false)
	if err != nil || len(got.Variants) != 2 || got.Variants[0].Counts["executions"] != 3 {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := l.Get(ctx, "claim", r.ID, user+1, false); err != labs.ErrRunNotFound {
		t.Fatalf("someone else's run: %v", err)
	}
	if _, err := l.Get(ctx, "fencing", r.ID, user, false); err != labs.ErrRunNotFound {
		t.Fatalf("a run of another lab: %v", err)
	}
	for _, table := range []string{"effects", "claims_without_unique", "idempotency_keys"} {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM labs.`+table).Scan(&n); err != nil || n != 0 {
			t.Errorf("labs.%s keeps %d rows after the run (%v)", table, n, err)
		}
	}
	if _, err := l.Run(ctx, labs.RunRequest{Lab: "nope", UserID: user}, workflow.Hooks[labs.Run]{}); err != labs.ErrUnknownLab {
		t.Fatalf("unknown lab: %v", err)
	}
}

// Every code reference names a line the embedded source really has, once.
func TestCodeReferencesPointAtTheirLines(t *testing.T) {
	t.Parallel()
	for _, lab := range labs.All() {
		if len(lab.Code) == 0 {
			t.Errorf("%s: no code reference", lab.Name)
		}
		for _, ref := range lab.Code {
			if ref.Line == 0 {
				t.Errorf("%s: no line of %s says %q", lab.Name, ref.Path, ref.Text)
				continue
			}
			raw, err := os.ReadFile(filepath.Join("..", "..", ref.Path))
			if err != nil {
				t.Fatalf("%s: %v", lab.Name, err)
			}
			// The embedded tree is the tree on disk: the same line says it.
			lines := strings.Split(string(raw), "\n")
			if got := strings.TrimSpace(lines[ref.Line-1]); got != ref.Text {
				t.Errorf("%s: %s:%d says %q, not %q", lab.Name, ref.Path, ref.Line, got, ref.Text)
			}
		}
	}
}

func TestOrderingLab(t *testing.T) {
	t.Parallel()
	l, db, user := setup(t)
	for range repeats {
		v := run(t, l, user, "ordering")
		want(t, v["naive"], false, map[string]int{"deliveries": 4, "effects": 3, "parked": 0, "out_of_place": 2, "wrong": 1})
		want(t, v["versioned"], true, map[string]int{"deliveries": 4, "effects": 3, "parked": 1, "out_of_place": 0, "wrong": 0})
	}
	// The run's scratch is gone: the projections, their events, the parked.
	for _, table := range []string{"histories", "history_events", "history_parked", "inbox", "event_deliveries"} {
		var n int
		if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM labs.`+table).Scan(&n); err != nil || n != 0 {
			t.Errorf("labs.%s keeps %d rows after the runs (%v)", table, n, err)
		}
	}
}

// The failover lab, on a private primary and standby (internal/pgcluster):
// both asynchronous variants lose the answers of the two cancellations the
// standby never got and run them again — the first cancels those policies
// twice, the second's provider key (from the policy) catches the repeat —
// and the synchronous standby answers only what it has, losing nothing.
// A second run started while one is under way is turned away.
func TestFailoverLab(t *testing.T) {
	testenv.SkipIfShort(t, "starts PostgreSQL servers of its own")
	t.Parallel()
	l, _, user := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Two runs at once: one runs, the other is turned away while it does.
	runs := make([]labs.Run, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			runs[i], errs[i] = l.Run(ctx, labs.RunRequest{Lab: "failover", UserID: user}, workflow.Hooks[labs.Run]{})
		}()
	}
	close(start)
	wg.Wait()
	ran := slices.IndexFunc(errs, func(err error) bool { return err == nil })
	if ran < 0 {
		t.Fatalf("no run finished: %v", errors.Join(errs...))
	}
	r, other := runs[ran], errs[1-ran]
	if !errors.Is(other, labs.ErrUnavailable) || !strings.Contains(other.Error(), "another run") {
		t.Errorf("a second run beside the first: %v, want ErrUnavailable (another run under way)", other)
	}
	v := map[string]labs.Variant{}
	for _, vr := range r.Variants {
		v[vr.Name] = vr
		t.Logf("%s: %s\n%s", vr.Title, vr.Verdict, timelineText(vr))
	}
	want(t, v["async"], false, map[string]int{"acknowledged": 5, "lost": 2, "twice": 2, "caught_by_key": 0, "caught_by_identity": 0})
	want(t, v["async-identity-key"], false, map[string]int{"acknowledged": 5, "lost": 2, "twice": 0, "caught_by_key": 2, "caught_by_identity": 0})
	want(t, v["sync"], true, map[string]int{"acknowledged": 3, "lost": 0, "twice": 0, "caught_by_key": 0, "caught_by_identity": 0})
	if len(r.Variants) != 3 {
		t.Errorf("%d variants, want 3", len(r.Variants))
	}
}

// Without the server binaries the failover lab says, before any run, what
// is missing and where it looked; a run answers ErrUnavailable with the
// same words and starts nothing.
func TestFailoverLabSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	empty := t.TempDir()
	l, err := labs.New(db.Pool, labs.Config{PostgresBinDir: empty})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	why := l.Unavailable("failover")
	for _, must := range []string{"initdb", "postgres", "pg_ctl", "pg_basebackup", empty} {
		if !strings.Contains(why, must) {
			t.Errorf("Unavailable says %q; it does not name %q", why, must)
		}
	}
	if other := l.Unavailable("claim"); other != "" {
		t.Errorf("the claim lab needs nothing more, yet: %q", other)
	}
	var user int64
	db.Pool.QueryRow(context.Background(), `
		INSERT INTO users (name, api_token_sha256)
		VALUES ('lab-tester', sha256('lab-tester'::bytea))
		RETURNING id`).Scan(&user)
	_, err = l.Run(context.Background(), labs.RunRequest{Lab: "failover", UserID: user}, workflow.Hooks[labs.Run]{})
	if !errors.Is(err, labs.ErrUnavailable) || !strings.Contains(err.Error(), "pg_basebackup") {
		t.Fatalf("a run without the binaries: %v, want ErrUnavailable naming them", err)
	}
}

// Every lab says in one sentence what it is about (Lab.Summary): the labs'
// index lists it and the lab's page opens with it, so the two agree (issue
// 29's second read, finding 12) — a lab without one would list nothing.
func TestEveryLabHasASummary(t *testing.T) {
	for _, lab := range labs.All() {
		if s := strings.TrimSpace(lab.Summary); s == "" || !strings.HasSuffix(s, ".") || len(s) > 300 {
			t.Errorf("lab %d (%s): summary %q", lab.Number, lab.Name, lab.Summary)
		}
	}
}
