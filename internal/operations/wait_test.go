package operations_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/testdb"
)

func TestWaitWakesOnTheCommitThatMakesAnOperationFinal(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seed(t, db, 3, `'IN_PROGRESS'`)
	w := operations.NewWaiter(db.Pool, db.Pool.Config().ConnConfig, slog.Default())
	go w.Run(ctx)

	// Operation 1 ends while two requests wait on it; both wake at once.
	type result struct {
		status string
		took   time.Duration
		err    error
	}
	results := make(chan result, 2)
	for range 2 {
		go func() {
			start := time.Now()
			s, err := w.Wait(ctx, 1, 20*time.Second)
			results <- result{s, time.Since(start), err}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	// A transition that rolls back notifies nobody.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE operations SET status = 'FAILED' WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-results:
		t.Fatalf("a wait returned after a rollback: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE operations SET status = 'SUCCEEDED', finished_at = now() WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r := <-results
		if r.err != nil || r.status != "SUCCEEDED" || r.took > 10*time.Second {
			t.Fatalf("wait: %+v; want SUCCEEDED, woken long before its 20 s", r)
		}
	}

	// Out of time: the status as it is.
	start := time.Now()
	s, err := w.Wait(ctx, 2, 200*time.Millisecond)
	if err != nil || s != "IN_PROGRESS" || time.Since(start) < 200*time.Millisecond {
		t.Fatalf("wait on a live operation: %q, %v after %v; want IN_PROGRESS after 200 ms", s, err, time.Since(start))
	}
	// Already final: no wait at all.
	if s, err := w.Wait(ctx, 1, time.Minute); err != nil || s != "SUCCEEDED" {
		t.Fatalf("wait on a final operation: %q, %v", s, err)
	}
	if _, err := w.Wait(ctx, 999, time.Second); err != operations.ErrNotFound {
		t.Fatalf("wait on no operation: %v, want ErrNotFound", err)
	}

	// The process stops: every wait returns at once.
	go func() { time.Sleep(200 * time.Millisecond); cancel() }()
	start = time.Now()
	if s, _ := w.Wait(context.Background(), 3, 20*time.Second); s != "IN_PROGRESS" || time.Since(start) > 10*time.Second {
		t.Fatalf("wait during shutdown: %q after %v", s, time.Since(start))
	}
}
