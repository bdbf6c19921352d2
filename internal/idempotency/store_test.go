package idempotency_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/idempotency"
)

func TestStore(t *testing.T) {
	runGroup(t, []subtest{
		{"ClaimThenCompleteThenReplay", testClaimThenCompleteThenReplay},
		{"ZombieOwnerIsFencedOut", testZombieOwnerIsFencedOut},
		{"TakeOverWaitsForAnOpenCompletion", testTakeOverWaitsForAnOpenCompletion},
		{"ClaimWaitsForTheOriginalsTransaction", testClaimWaitsForTheOriginalsTransaction},
		{"EndLeaseNeverTouchesACompletedKey", testEndLeaseNeverTouchesACompletedKey},
	})
}

func fp(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

// claimCommitted claims key in a transaction of its own and commits, as a
// workflow's first transaction does before it calls another system.
func claimCommitted(t testing.TB, b bundle, key string, fingerprint []byte) *idempotency.Claim {
	t.Helper()
	c, err := claimIn(context.Background(), b, b.alice, key, fingerprint)
	if err != nil || c == nil {
		t.Fatalf("claim %q = %v, %v", key, c, err)
	}
	return c
}

func claimIn(ctx context.Context, b bundle, user int64, key string, fingerprint []byte) (*idempotency.Claim, error) {
	return claimWith(ctx, b.store, b, user, key, fingerprint)
}

// claimWith claims key for user through store, committed.
func claimWith(ctx context.Context, store *idempotency.Store, b bundle, user int64, key string, fingerprint []byte) (c *idempotency.Claim, err error) {
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c, err = store.Claim(ctx, tx, user, key, fingerprint)
		return err
	})
	return c, err
}

func testClaimThenCompleteThenReplay(t *testing.T, b bundle) {
	ctx := context.Background()

	claim := claimCommitted(t, b, "k1", fp("req"))
	if c, err := claimIn(ctx, b, b.alice, "k1", fp("req")); err != nil || c != nil {
		t.Fatalf("second claim = %v, %v; want nothing: the key is taken", c, err)
	}
	rec, err := b.store.Lookup(ctx, b.alice, "k1")
	if err != nil || rec.Status != idempotency.StatusInProgress || rec.LeaseExpired {
		t.Fatalf("in flight: %+v, %v; want IN_PROGRESS under a live lease", rec, err)
	}
	want := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	if err := claim.Complete(ctx, b.pool, want); err != nil {
		t.Fatal(err)
	}
	rec, err = b.store.Lookup(ctx, b.alice, "k1")
	if err != nil || rec.Status != idempotency.StatusCompleted || rec.Response.Status != 201 ||
		string(rec.Response.Body) != `{"id":1}` || rec.Response.Header.Get("Content-Type") != "application/json" {
		t.Errorf("completed record = %+v, %v", rec, err)
	}
	// Keys are per user: bob's k1 is another key altogether.
	if c, err := claimIn(ctx, b, b.bob, "k1", fp("other")); err != nil || c == nil {
		t.Errorf("bob's k1: claim = %v, err = %v; want a claim", c, err)
	}
}

// The zombie: an owner stalls past its lease, a retry takes over and
// completes, and the old owner's late Complete must change nothing — its
// transaction rolls back with its business write.
func testZombieOwnerIsFencedOut(t *testing.T, b bundle) {
	ctx := context.Background()

	old := claimCommitted(t, b, "k", fp("req"))
	if c, err := takeOverIn(ctx, b, "k", fp("req")); err != nil || c != nil {
		t.Fatalf("TakeOver under a live lease = %v, %v; want nothing", c, err)
	}

	b.store.SetNow(later(testLease + time.Second))
	if c, err := takeOverIn(ctx, b, "k", fp("different")); err != nil || c != nil {
		t.Fatalf("TakeOver by a different request = %v, %v; want nothing", c, err)
	}
	retry, err := takeOverIn(ctx, b, "k", fp("req"))
	if err != nil || retry == nil {
		t.Fatalf("TakeOver after the lease = %v, %v; want a claim", retry, err)
	}
	if err := writeNote(ctx, b, retry, "retry"); err != nil {
		t.Fatalf("retry's transaction: %v", err)
	}

	err = writeNote(ctx, b, old, "zombie")
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("zombie's Complete: err = %v, want ErrLeaseLost", err)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notes WHERE user_id = $1 AND note = 'zombie'`, b.alice); n != 0 {
		t.Errorf("zombie's business write committed (%d rows); its transaction must roll back", n)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notes WHERE user_id = $1 AND note = 'retry'`, b.alice); n != 1 {
		t.Errorf("retry's notes = %d, want 1", n)
	}
	if err := b.store.EndLease(ctx, old); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("zombie's EndLease: err = %v, want ErrLeaseLost", err)
	}
}

func takeOverIn(ctx context.Context, b bundle, key string, fingerprint []byte) (c *idempotency.Claim, err error) {
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		c, err = b.store.TakeOver(ctx, tx, b.alice, key, fingerprint)
		return err
	})
	return c, err
}

// writeNote is a handler's transaction: a business write, then Complete.
func writeNote(ctx context.Context, b bundle, claim *idempotency.Claim, note string) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO notes (user_id, note) VALUES ($1, $2)`, claim.UserID, note); err != nil {
			return err
		}
		return claim.Complete(ctx, tx, idempotency.Response{Status: 200, Body: []byte(note)})
	})
}

// Complete takes the key's row lock inside the handler's transaction: a
// take-over that arrives meanwhile waits, then sees COMPLETED and takes nothing.
func testTakeOverWaitsForAnOpenCompletion(t *testing.T, b bundle) {
	ctx := context.Background()

	old := claimCommitted(t, b, "k", fp("req"))
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := old.Complete(ctx, tx, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}

	b.store.SetNow(later(testLease + time.Second))
	done := make(chan *idempotency.Claim)
	go func() {
		c, err := takeOverIn(ctx, b, "k", fp("req"))
		if err != nil {
			t.Error(err)
		}
		done <- c
	}()
	select {
	case c := <-done:
		t.Fatalf("TakeOver did not wait for the open transaction (got %v)", c)
	case <-time.After(100 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c := <-done; c != nil {
		t.Error("TakeOver took a key that completed while it waited")
	}
}

// Claim waits on the unique index for a concurrent claim's open
// transaction: when it commits, the key is taken; when it rolls back (a crash
// before the first commit), the key was never claimed and the waiter gets it.
func testClaimWaitsForTheOriginalsTransaction(t *testing.T, b bundle) {
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		key := fmt.Sprintf("wait-%v", commit)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c, err := b.store.Claim(ctx, tx, b.alice, key, fp("req")); err != nil || c == nil {
			t.Fatalf("original claim = %v, %v", c, err)
		}
		done := make(chan *idempotency.Claim)
		go func() {
			c, err := claimIn(ctx, b, b.alice, key, fp("req"))
			if err != nil {
				t.Error(err)
			}
			done <- c
		}()
		select {
		case c := <-done:
			t.Fatalf("the duplicate's claim did not wait (got %v)", c)
		case <-time.After(100 * time.Millisecond):
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if c := <-done; (c != nil) == commit {
			t.Errorf("original committed=%v: the duplicate's claim = %v", commit, c)
		}
	}
}

func testEndLeaseNeverTouchesACompletedKey(t *testing.T, b bundle) {
	ctx := context.Background()

	claim := claimCommitted(t, b, "k", fp("req"))
	if err := claim.Complete(ctx, b.pool, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.EndLease(ctx, claim); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("EndLease of a completed key: err = %v, want ErrLeaseLost", err)
	}
	if rec, err := b.store.Lookup(ctx, b.alice, "k"); err != nil || rec.Status != idempotency.StatusCompleted {
		t.Errorf("completed key after EndLease: %+v, %v", rec, err)
	}
	var nilClaim *idempotency.Claim
	if err := nilClaim.Complete(ctx, b.pool, idempotency.Response{}); err != nil {
		t.Errorf("nil claim Complete = %v, want nil", err)
	}
	var nilAttempt *idempotency.Attempt
	if c, err := nilAttempt.Claim(ctx, nil); c != nil || err != nil {
		t.Errorf("nil attempt Claim = %v, %v; want nothing", c, err)
	}
}

func TestJanitorPurgesExpiredKeysInBatches(t *testing.T) {
	t.Parallel()
	b := newEnv(t).bundle(t)
	ctx := context.Background()

	for i := range 25 {
		c, err := claimIn(ctx, b, b.alice, fmt.Sprint("done-", i), fp("req"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Complete(ctx, b.pool, idempotency.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	// A key whose owner died long ago: purged too, once its retention passed.
	if _, err := claimIn(ctx, b, b.alice, "abandoned", fp("req")); err != nil {
		t.Fatal(err)
	}
	// A key claimed "tomorrow" under a live lease, on a store whose TTL is
	// shorter than its lease (a misconfiguration): never purged while leased.
	short := idempotency.NewStore(b.pool, time.Hour, time.Minute)
	tomorrow := later(testTTL + time.Hour)
	short.SetNow(tomorrow)
	if _, err := claimWith(ctx, short, b, b.alice, "leased", fp("req")); err != nil {
		t.Fatal(err)
	}
	// A key completed "tomorrow": within its retention.
	b.store.SetNow(tomorrow)
	recent, _ := claimIn(ctx, b, b.bob, "recent", fp("req"))
	if err := recent.Complete(ctx, b.pool, idempotency.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}

	b.store.SetNow(tomorrow.Add(2 * time.Minute))
	j := idempotency.NewJanitor(b.store, idempotency.JanitorConfig{BatchSize: 10, MaxBatches: 2})
	if n, err := j.RunOnce(ctx); err != nil || n != 20 {
		t.Fatalf("first run purged %d, %v; want 20 (two batches of 10)", n, err)
	}
	if n, err := j.RunOnce(ctx); err != nil || n != 6 {
		t.Fatalf("second run purged %d, %v; want the other 6", n, err)
	}
	if n, err := j.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("third run purged %d, %v; want 0", n, err)
	}
	if _, err := b.store.Lookup(ctx, b.alice, "leased"); err != nil {
		t.Errorf("a key under a live lease was purged: %v", err)
	}
	if _, err := b.store.Lookup(ctx, b.bob, "recent"); err != nil {
		t.Errorf("a key within its retention was purged: %v", err)
	}
	if _, err := b.store.Lookup(ctx, b.alice, "done-3"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Errorf("expired key still there: %v", err)
	}
}
