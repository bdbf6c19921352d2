package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/idempotency"
)

func TestMiddleware(t *testing.T) {
	runGroup(t, []subtest{
		{"ConcurrentDuplicatesExecuteOnce", testConcurrentDuplicatesExecuteOnce},
		{"ReplayIsByteIdenticalAcrossRestart", testReplayIsByteIdenticalAcrossRestart},
		{"SameKeyDifferentRequestIs422", testSameKeyDifferentRequestIs422},
		{"SameKeyOtherUserExecutesIndependently", testSameKeyOtherUserExecutesIndependently},
		{"RetryTakesOverFromADeadOwner", testRetryTakesOverFromADeadOwner},
		{"PanicLeavesKeyInProgressUntilLeaseExpires", testPanicLeavesKeyInProgressUntilLeaseExpires},
		{"RefusalsAreStoredFailuresAreNot", testRefusalsAreStoredFailuresAreNot},
		{"FailureAfterTheFirstCommitEndsTheLease", testFailureAfterTheFirstCommitEndsTheLease},
		{"AnOwnerThatLostItsKeyAnswersTheWinners", testAnOwnerThatLostItsKeyAnswersTheWinners},
		{"DuplicateWaitsForTheOriginalsTransactionBounded", testDuplicateWaitsForTheOriginalsTransactionBounded},
		{"RejectedBeforeExecutionStoresNothing", testRejectedBeforeExecutionStoresNothing},
		{"MissingOrMalformedKeyIs400", testMissingOrMalformedKeyIs400},
		{"FormSubmissionWithHiddenKey", testFormSubmissionWithHiddenKey},
		{"FormDoubleClick", testFormDoubleClick},
	})
}

// 100 copies of one request, one key, released at once: the workflow runs
// exactly once; every other answer is its replay or a 409; none is a 500.
// Copies that reach the claim while the original's transaction is open wait
// for it on the unique index and then replay its answer.
func testConcurrentDuplicatesExecuteOnce(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store, delay: 100 * time.Millisecond}
	srv := a.server(t, idempotency.Config{})

	const n = 100
	start := make(chan struct{})
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = postJSON(t, srv, "/api/notes", b.alice, "double-click", `{"note":"hello"}`)
		})
	}
	close(start)
	wg.Wait()

	var first result
	var executed, replayed, inFlight int
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			executed++
			first = r
		case r.status == http.StatusCreated:
			replayed++
		case r.status == http.StatusConflict:
			inFlight++
			if r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, `"request-in-progress"`) {
				t.Errorf("409 without Retry-After or type: %v %s", r.header, r.body)
			}
		default:
			t.Errorf("unexpected answer %d: %s", r.status, r.body)
		}
	}
	t.Logf("executed %d, replayed %d, 409 %d", executed, replayed, inFlight)
	if executed != 1 || a.executions.Load() != 1 {
		t.Fatalf("executed %d times (handler bodies %d), want once", executed, a.executions.Load())
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notes WHERE user_id = $1`, b.alice); n != 1 {
		t.Errorf("notes = %d, want 1", n)
	}
	for _, r := range results {
		if r.replayed() {
			sameResponse(t, first, r)
		}
	}
	// Once the original has finished, every duplicate is a replay.
	sameResponse(t, first, postJSON(t, srv, "/api/notes", b.alice, "double-click", `{"note":"hello"}`))
}

// A replay is the stored bytes, even from a new server process with a new
// store on the same database, and even when the JSON body is re-ordered.
func testReplayIsByteIdenticalAcrossRestart(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	first := postJSON(t, a.server(t, idempotency.Config{}), "/api/notes", b.alice, "k1", `{"note":"hi"}`)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first = %d %v %s", first.status, first.header, first.body)
	}

	restarted := &app{pool: b.pool, store: idempotency.NewStore(b.pool, testLease, testTTL)}
	srv := restarted.server(t, idempotency.Config{})
	again := postJSON(t, srv, "/api/notes", b.alice, "k1", "{ \"note\" :\n \"hi\" }")
	if !again.replayed() {
		t.Errorf("no %s: true on the replay", idempotency.ReplayedHeader)
	}
	sameResponse(t, first, again)
	if restarted.executions.Load() != 0 {
		t.Error("the restarted server executed the request again")
	}
	// The draft's quoted form of the header names the same key.
	sameResponse(t, first, postJSON(t, srv, "/api/notes", b.alice, `"k1"`, `{"note":"hi"}`))
}

func testSameKeyDifferentRequestIs422(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":"one"}`)
	r := postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":"two"}`)
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, `"idempotency-key-reused"`) {
		t.Errorf("different body = %d %s, want 422 idempotency-key-reused", r.status, r.body)
	}
	r = postJSON(t, srv, "/api/notes/7/missing", b.alice, "k1", `{"note":"one"}`)
	if r.status != http.StatusUnprocessableEntity {
		t.Errorf("different route = %d %s, want 422", r.status, r.body)
	}
	if a.executions.Load() != 1 {
		t.Errorf("executions = %d, want 1", a.executions.Load())
	}
}

func testSameKeyOtherUserExecutesIndependently(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	ra := postJSON(t, srv, "/api/notes", b.alice, "shared-key", `{"note":"x"}`)
	rb := postJSON(t, srv, "/api/notes", b.bob, "shared-key", `{"note":"x"}`)
	if ra.status != http.StatusCreated || rb.status != http.StatusCreated || rb.replayed() || ra.body == rb.body {
		t.Errorf("alice %d %s, bob %d %s: want two separate executions", ra.status, ra.body, rb.status, rb.body)
	}
	if n := count(t, b.pool, `SELECT count(DISTINCT user_id) FROM notes WHERE user_id IN ($1, $2)`, b.alice, b.bob); n != 2 {
		t.Errorf("notes by %d users, want 2", n)
	}
}

// The owner dies holding the key (it claimed, then never completed). After
// its lease the retry takes over and completes; the old owner's late
// Complete finds no row and its transaction rolls back.
func testRetryTakesOverFromADeadOwner(t *testing.T, b bundle) {
	ctx := context.Background()
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})
	body := `{"note":"hi"}`

	dead := claimCommitted(t, b, "k1", idempotency.Fingerprint(idempotency.Request{
		Method: http.MethodPost, Route: "/api/notes", ContentType: "application/json", Body: []byte(body),
	}))
	if r := postJSON(t, srv, "/api/notes", b.alice, "k1", body); r.status != http.StatusConflict {
		t.Fatalf("under a live lease = %d %s, want 409", r.status, r.body)
	}

	b.store.SetNow(later(testLease + time.Second))
	retry := postJSON(t, srv, "/api/notes", b.alice, "k1", body)
	if retry.status != http.StatusCreated || retry.replayed() {
		t.Fatalf("retry after the lease = %d %s, want 201 executed", retry.status, retry.body)
	}

	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO notes (user_id, note) VALUES ($1, 'zombie')`, b.alice); err != nil {
			return err
		}
		return dead.Complete(ctx, tx, idempotency.Response{Status: 500})
	})
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("dead owner's late Complete: err = %v, want ErrLeaseLost", err)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notes WHERE user_id = $1 AND note = 'zombie'`, b.alice); n != 0 {
		t.Error("the zombie's business write committed")
	}
	sameResponse(t, retry, postJSON(t, srv, "/api/notes", b.alice, "k1", body))
}

// A panic is treated like a crash: the key stays IN_PROGRESS until the lease
// expires, then a retry takes over.
func testPanicLeavesKeyInProgressUntilLeaseExpires(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	if r := postJSON(t, srv, "/api/panic", b.alice, "k1", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("panic = %d, want 500", r.status)
	}
	if r := postJSON(t, srv, "/api/panic", b.alice, "k1", `{}`); r.status != http.StatusConflict {
		t.Fatalf("retry under the lease = %d, want 409", r.status)
	}
	b.store.SetNow(later(testLease + time.Second))
	if r := postJSON(t, srv, "/api/panic", b.alice, "k1", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("retry after the lease = %d, want 500 (it executed again)", r.status)
	}
}

// A business refusal (here a 404) is the workflow's answer: stored with the
// claim in one commit and replayed. A failure rolls the claim back with
// everything else, so a retry executes afresh.
func testRefusalsAreStoredFailuresAreNot(t *testing.T, b bundle) {
	ctx := context.Background()
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	notFound := postJSON(t, srv, "/api/notes/7/missing", b.alice, "k404", `{}`)
	if notFound.status != http.StatusNotFound || notFound.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("404 route = %d %v", notFound.status, notFound.header)
	}
	again := postJSON(t, srv, "/api/notes/7/missing", b.alice, "k404", `{}`)
	if !again.replayed() {
		t.Error("the stored 404 was not replayed")
	}
	sameResponse(t, notFound, again)

	if r := postJSON(t, srv, "/api/fail", b.alice, "k500", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("failing route = %d, want 500", r.status)
	}
	if _, err := b.store.Lookup(ctx, b.alice, "k500"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("a failed workflow left its key behind: %v", err)
	}
	if r := postJSON(t, srv, "/api/fail", b.alice, "k500", `{}`); r.status != http.StatusInternalServerError || a.executions.Load() != 3 {
		t.Errorf("retry of the failed request = %d after %d executions, want 500 after a third execution", r.status, a.executions.Load())
	}
}

// A workflow whose claim committed (it called another system) and which then
// failed to record the outcome ends its lease: the retry need not wait for
// the lease to run out, it takes over at once.
func testFailureAfterTheFirstCommitEndsTheLease(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	if r := postJSON(t, srv, "/api/two-step", b.alice, "k", `{"outcome":"fail"}`); r.status != http.StatusInternalServerError {
		t.Fatalf("failing second step = %d %s, want 500", r.status, r.body)
	}
	rec, err := b.store.Lookup(context.Background(), b.alice, "k")
	if err != nil || rec.Status != idempotency.StatusInProgress || !rec.LeaseExpired {
		t.Fatalf("after the failure: %+v, %v; want IN_PROGRESS with its lease ended", rec, err)
	}
	retry := postJSON(t, srv, "/api/two-step", b.alice, "k", `{"outcome":"fail"}`)
	if retry.status != http.StatusInternalServerError || a.executions.Load() != 2 {
		t.Fatalf("retry = %d after %d executions; want it to take over and run again", retry.status, a.executions.Load())
	}
}

// The paused owner: A claims and commits, then stalls past its lease; B (a
// retry with the same key) takes the key over and completes it. When A wakes
// its fenced Complete changes nothing — and A answers nothing of its own: its
// client gets B's stored answer, replayed, never a lease-lost error.
func testAnOwnerThatLostItsKeyAnswersTheWinners(t *testing.T, b bundle) {
	paused := &app{pool: b.pool, store: b.store, started: make(chan struct{}, 1), proceed: make(chan struct{})}
	srvA := paused.server(t, idempotency.Config{})
	retry := &app{pool: b.pool, store: b.store}
	srvB := retry.server(t, idempotency.Config{})

	answerA := make(chan result)
	go func() { answerA <- postJSON(t, srvA, "/api/two-step", b.alice, "k", `{}`) }()
	<-paused.started

	b.store.SetNow(later(testLease + time.Second)) // A's lease runs out while it is paused
	answerB := postJSON(t, srvB, "/api/two-step", b.alice, "k", `{}`)
	if answerB.status != http.StatusOK || answerB.replayed() {
		t.Fatalf("B = %d %s, want 200 executed", answerB.status, answerB.body)
	}
	b.store.SetNow(time.Time{})
	close(paused.proceed)
	a := <-answerA
	if !a.replayed() {
		t.Errorf("A answered %d %s of its own; want B's answer replayed", a.status, a.body)
	}
	sameResponse(t, answerB, a)
	rec, err := b.store.Lookup(context.Background(), b.alice, "k")
	if err != nil || string(rec.Response.Body) != answerB.body {
		t.Errorf("stored answer = %+v, %v; want B's", rec, err)
	}
}

// A duplicate that reaches the claim while the original's first transaction
// is open waits for it — and replays its answer. The wait is bounded: past
// the claim's wait it is told the request is in progress.
func testDuplicateWaitsForTheOriginalsTransactionBounded(t *testing.T, b bundle) {
	for i, tc := range []struct {
		name      string
		delay     time.Duration
		claimWait time.Duration
		want      int
	}{
		{"original commits within the wait: replay", 300 * time.Millisecond, 2 * time.Second, http.StatusCreated},
		{"original outlasts the wait: 409", 1500 * time.Millisecond, 200 * time.Millisecond, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := idempotency.NewStore(b.pool, testLease, testTTL)
			store.SetClaimWait(tc.claimWait)
			a := &app{pool: b.pool, store: store, delay: tc.delay, started: make(chan struct{}, 1)}
			srv := a.server(t, idempotency.Config{})
			key := fmt.Sprintf("wait-%d", i)
			firstDone := make(chan result)
			go func() { firstDone <- postJSON(t, srv, "/api/notes", b.alice, key, `{"note":"x"}`) }()
			<-a.started // the original holds the key inside its open transaction
			second := postJSON(t, srv, "/api/notes", b.alice, key, `{"note":"x"}`)
			first := <-firstDone
			if second.status != tc.want {
				t.Fatalf("duplicate = %d %s, want %d", second.status, second.body, tc.want)
			}
			if tc.want == http.StatusCreated {
				if !second.replayed() {
					t.Error("the duplicate executed instead of replaying")
				}
				sameResponse(t, first, second)
			} else if second.header.Get("Retry-After") == "" || !strings.Contains(second.body, "request-in-progress") {
				t.Errorf("409 without Retry-After or type: %v %s", second.header, second.body)
			}
			if a.executions.Load() != 1 {
				t.Errorf("executions = %d, want 1", a.executions.Load())
			}
		})
	}
}

// Requests refused before execution store nothing: a key that is missing or
// malformed, an unauthenticated caller, or a validation error the handler
// returns before its workflow claims the key. The corrected request may then
// reuse the key.
func testRejectedBeforeExecutionStoresNothing(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	r := postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":""}`)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "validation-failed") {
		t.Fatalf("invalid note = %d %s, want 400 validation-failed", r.status, r.body)
	}
	r = postJSON(t, srv, "/api/notes", b.alice, "k2", `{"note":`)
	if r.status != http.StatusBadRequest {
		t.Fatalf("broken JSON = %d %s, want 400", r.status, r.body)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM idempotency_keys WHERE user_id = $1`, b.alice); n != 0 {
		t.Fatalf("%d keys stored for rejected requests", n)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/notes", strings.NewReader(`{"note":"x"}`))
	req.Header.Set(idempotency.HeaderName, "k3")
	if r := do(t, req); r.status != http.StatusUnauthorized {
		t.Errorf("no user = %d, want 401", r.status)
	}
	if r := postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":"fixed"}`); r.status != http.StatusCreated || r.replayed() {
		t.Errorf("corrected request with the same key = %d %s, want 201 executed", r.status, r.body)
	}
}

func testMissingOrMalformedKeyIs400(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	tests := []struct {
		name, key, typ, detail string
	}{
		{"missing", "-", "idempotency-key-missing", "needs an idempotency key in the Idempotency-Key header"},
		{"empty", "", "idempotency-key-malformed", "the idempotency key is empty"},
		{"256 characters", strings.Repeat("k", 256), "idempotency-key-malformed", "256 characters long; at most 255"},
		{"control character", "abc\tdef", "idempotency-key-malformed", "byte 0x09 at position 3"},
		{"space", "two words", "idempotency-key-malformed", "byte 0x20 at position 3"},
		{"non-ASCII", "clé", "idempotency-key-malformed", "byte 0xC3 at position 2"},
		{"bad quoted string", `"a\b"`, "idempotency-key-malformed", "invalid escape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := postJSON(t, srv, "/api/notes", b.alice, tt.key, `{"note":"x"}`)
			if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"`+tt.typ+`"`) || !strings.Contains(r.body, tt.detail) {
				t.Errorf("= %d %s\nwant 400 %s with detail containing %q", r.status, r.body, tt.typ, tt.detail)
			}
		})
	}
	if ok := postJSON(t, srv, "/api/notes", b.alice, strings.Repeat("k", 255), `{"note":"x"}`); ok.status != http.StatusCreated {
		t.Errorf("255-character key = %d %s, want 201", ok.status, ok.body)
	}
	if a.executions.Load() != 1 {
		t.Errorf("executions = %d, want 1", a.executions.Load())
	}
}

// Browser forms: the key is a hidden field minted when the form rendered; a
// resubmission replays the 303 (POST/redirect/GET); a fresh CSRF token does
// not make it a different request; refusals are an HTML message.
func testFormSubmissionWithHiddenKey(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	form := url.Values{"note": {"from a form"}, "idempotency_key": {"form-1"}, "_csrf": {"token-a"}}
	first := postForm(t, srv, "/forms/notes", b.alice, form)
	if first.status != http.StatusSeeOther || !strings.HasPrefix(first.header.Get("Location"), "/notes/") {
		t.Fatalf("form post = %d %v, want 303 to the note", first.status, first.header)
	}
	form.Set("_csrf", "token-b")
	again := postForm(t, srv, "/forms/notes", b.alice, form)
	if !again.replayed() {
		t.Error("resubmission was not a replay")
	}
	sameResponse(t, first, again)

	form.Set("note", "something else")
	if r := postForm(t, srv, "/forms/notes", b.alice, form); r.status != http.StatusUnprocessableEntity ||
		r.body != "<p class=notice>Idempotency key reused</p>" {
		t.Errorf("changed form, same key = %d %q, want the HTML notice", r.status, r.body)
	}
	if r := postForm(t, srv, "/forms/notes", b.alice, url.Values{"note": {"x"}}); r.status != http.StatusBadRequest ||
		!strings.Contains(r.body, "Idempotency key missing") {
		t.Errorf("form without key = %d %q", r.status, r.body)
	}
	if a.executions.Load() != 1 {
		t.Errorf("executions = %d, want 1", a.executions.Load())
	}
}

// A double-click. On a form whose work stays in PostgreSQL the second
// submission waits on the claim for the first's transaction and replays its
// redirect. On a form whose work calls another system, the first's claim is
// committed while the call is under way: with WaitInFlight the second waits
// for the answer and replays it; without, it gets the in-flight notice and
// Retry-After.
func testFormDoubleClick(t *testing.T, b bundle) {
	a := &app{pool: b.pool, store: b.store, delay: 300 * time.Millisecond, started: make(chan struct{}, 1)}
	srv := a.server(t, idempotency.Config{})
	form := url.Values{"note": {"x"}, "idempotency_key": {"dbl-one-tx"}}
	firstDone := make(chan result)
	go func() { firstDone <- postForm(t, srv, "/forms/notes", b.alice, form) }()
	<-a.started
	second := postForm(t, srv, "/forms/notes", b.alice, form)
	first := <-firstDone
	if !second.replayed() {
		t.Errorf("one transaction: second = %d %v, want the replayed redirect", second.status, second.header)
	}
	sameResponse(t, first, second)

	for _, wait := range []time.Duration{0, 2 * time.Second} {
		a := &app{pool: b.pool, store: b.store, started: make(chan struct{}, 1), proceed: make(chan struct{})}
		srv := a.server(t, idempotency.Config{WaitInFlight: wait})
		form := url.Values{"idempotency_key": {"dbl-" + wait.String()}}

		firstDone := make(chan result)
		go func() { firstDone <- postForm(t, srv, "/forms/two-step", b.alice, form) }()
		<-a.started
		secondDone := make(chan result)
		go func() { secondDone <- postForm(t, srv, "/forms/two-step", b.alice, form) }()
		if wait == 0 {
			second := <-secondDone
			close(a.proceed)
			<-firstDone
			if second.status != http.StatusConflict || second.header.Get("Retry-After") != "1" ||
				!strings.Contains(second.body, "Request in progress") {
				t.Errorf("no wait: second = %d %v %q, want 409 notice", second.status, second.header, second.body)
			}
		} else {
			time.Sleep(200 * time.Millisecond) // the second is waiting
			close(a.proceed)
			first, second := <-firstDone, <-secondDone
			if !second.replayed() {
				t.Errorf("waiting: second = %d %v, want the replayed answer", second.status, second.header)
			}
			sameResponse(t, first, second)
		}
		if a.executions.Load() != 1 {
			t.Errorf("wait %v: executions = %d, want 1", wait, a.executions.Load())
		}
	}
}

// Purged keys are forgotten: the same request executes afresh.
func TestPurgedKeyExecutesAfresh(t *testing.T) {
	t.Parallel()
	b := newEnv(t).bundle(t)
	a := &app{pool: b.pool, store: b.store}
	srv := a.server(t, idempotency.Config{})

	first := postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":"x"}`)
	b.store.SetNow(later(testTTL + time.Minute))
	if n, err := idempotency.NewJanitor(b.store, idempotency.JanitorConfig{}).RunOnce(context.Background()); err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want 1", n, err)
	}
	again := postJSON(t, srv, "/api/notes", b.alice, "k1", `{"note":"x"}`)
	if again.status != http.StatusCreated || again.replayed() || again.body == first.body {
		t.Errorf("after purge = %d %s, want a fresh execution", again.status, again.body)
	}
	if a.executions.Load() != 2 {
		t.Errorf("executions = %d, want 2", a.executions.Load())
	}
}
