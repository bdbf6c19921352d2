package web

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/internal/testdb"
)

// A write that breaks an invariant shows on the next page load, not
// seconds later (third read, finding 7: the banner lagged GET
// /api/v1/invariants by ~10 s after a resume cancelled a policy twice).
func TestTheBannerSeesABreakOnTheNextPage(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	app := New(Config{BodyLimit: "1M"}, Deps{
		Logger:   slog.New(slog.DiscardHandler),
		Pool:     db.Pool,
		Registry: prometheus.NewRegistry(),
		Recovery: recovery.New(nil, recovery.DefaultConfig()),
	})
	ctx := context.Background()
	if v := app.violationsNow(ctx); len(v) != 0 {
		t.Fatalf("a fresh database breaks invariants: %+v", v)
	}
	// Invariant 4's other half: a policy CANCELLED with no cancellation behind it.
	if _, err := db.Pool.Exec(ctx, `
		WITH u AS (
		    INSERT INTO users (name, api_token_sha256) VALUES ('banner', '\x00') RETURNING id
		)
		INSERT INTO policies (user_id, number, holder, premium, status, coverage_start, coverage_end)
		SELECT id, 'POL-BANNER', 'banner', 1, 'CANCELLED', current_date, current_date + 1 FROM u`); err != nil {
		t.Fatal(err)
	}
	if v := app.violationsNow(ctx); len(v) == 0 {
		t.Fatal("the banner's check, right after the break, still says nothing is broken")
	}
}
