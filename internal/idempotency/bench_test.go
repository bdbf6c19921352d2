package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemlab/idemlab/internal/idempotency"
)

// BenchmarkClaimComplete is the bookkeeping a first request pays: the claim
// INSERT and the completing UPDATE, in one transaction as in a workflow that
// stays in PostgreSQL.
func BenchmarkClaimComplete(b *testing.B) {
	bb := newEnv(b).bundle(b)
	ctx := context.Background()
	resp := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
	b.ResetTimer()
	for i := range b.N {
		err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
			claim, err := bb.store.Claim(ctx, tx, bb.alice, "bench-"+strconv.Itoa(i), fp("req"))
			if err != nil || claim == nil {
				return fmt.Errorf("claim = %v, %v", claim, err)
			}
			return claim.Complete(ctx, tx, resp)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay is what a duplicate of a completed request pays at the
// store: one lookup, no write.
func BenchmarkReplay(b *testing.B) {
	bb := newEnv(b).bundle(b)
	ctx := context.Background()
	claim := claimCommitted(b, bb, "k", fp("req"))
	if err := claim.Complete(ctx, bb.pool, idempotency.Response{Status: 201, Body: []byte(`{"id":1}`)}); err != nil {
		b.Fatal(err)
	}
	b.Run("Lookup", func(b *testing.B) {
		for range b.N {
			if _, err := bb.store.Lookup(ctx, bb.alice, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMiddleware is a whole HTTP round trip through Echo: a first
// request (claim, business insert and completion in one transaction) and a
// replay.
func BenchmarkMiddleware(b *testing.B) {
	bb := newEnv(b).bundle(b)
	a := &app{pool: bb.pool, store: bb.store}
	srv := a.server(b, idempotency.Config{})
	client := srv.Client()
	send := func(b *testing.B, key string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/notes", strings.NewReader(`{"note":"bench"}`))
		req.Header.Set("X-User", strconv.FormatInt(bb.alice, 10))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idempotency.HeaderName, key)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			b.Fatalf("status %d", res.StatusCode)
		}
	}
	b.Run("FirstRequest", func(b *testing.B) {
		for i := range b.N {
			send(b, "first-"+strconv.Itoa(i)+"-"+strconv.Itoa(b.N))
		}
	})
	send(b, "replayed")
	b.Run("Replay", func(b *testing.B) {
		for range b.N {
			send(b, "replayed")
		}
	})
}
