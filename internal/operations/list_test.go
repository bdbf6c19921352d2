package operations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/testdb"
)

// seed makes users alice (id 1) and bob (id 2) and n cancellations, one per
// policy, in the statuses of statusOf(i), with three steps each: the
// second, the provider call, SENT while the operation is live. It returns
// the operations' ids in order.
func seed(t testing.TB, db *testdb.DB, n int, statusOf string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`
		INSERT INTO users (name, role, api_token_sha256)
		VALUES ('alice', 'customer', sha256('a')), ('bob', 'customer', sha256('b'));

		INSERT INTO policies (user_id, number, holder, premium, status, coverage_start, coverage_end)
		SELECT 1 + i %% 2, format('P-%%s', i), 'Holder', 100, 'ACTIVE', current_date - 30, current_date + 335
		  FROM generate_series(1, %[1]d) AS i;

		INSERT INTO operations (policy_id, operation_type, user_id, idempotency_key, status,
		                        owner_token, lease_expires_at, created_at, finished_at)
		SELECT p.id, 'CANCEL', p.user_id, format('k-%%s', p.id), st.status, gen_random_uuid(),
		       now() + interval '1 hour', timestamptz '2026-01-01' + p.id * interval '1 minute',
		       CASE WHEN st.status IN ('SUCCEEDED', 'FAILED') THEN timestamptz '2026-01-01' + p.id * interval '2 minute' END
		  FROM policies p,
		       LATERAL (SELECT %[2]s AS status) st
		 ORDER BY p.id;

		INSERT INTO operation_steps (operation_id, run, position, name, step_key, system, state,
		                             deadline_at, sent_at, request, finished_at)
		SELECT o.id, 1, s.position, s.name, o.id || ':' || s.name, s.system, st.state,
		       now(), now(), '{}'::jsonb, CASE WHEN st.state IN ('DONE', 'FAILED') THEN now() END
		  FROM operations o,
		       (VALUES (1, 'record_intent', NULL), (2, 'provider_cancel', 'provider'), (3, 'mark_cancelled', NULL)) AS s(position, name, system),
		       LATERAL (SELECT CASE WHEN o.status = 'SUCCEEDED' OR s.position = 1 THEN 'DONE'
		                            WHEN s.position = 2 AND o.status IN ('IN_PROGRESS', 'RECOVERING', 'NEEDS_RECONCILIATION') THEN 'SENT'
		                            WHEN s.position = 2 THEN 'FAILED'
		                            ELSE 'PENDING' END AS state) st;
		ANALYZE;`, n, statusOf))
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
}

// fiveStatuses cycles through every status by policy id.
const fiveStatuses = `(ARRAY['SUCCEEDED', 'FAILED', 'IN_PROGRESS', 'NEEDS_RECONCILIATION', 'SUCCEEDED'])[1 + p.id % 5]`

func TestListFiltersPagesAndScopes(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	seed(t, db, 20, fiveStatuses)

	all, err := operations.List(ctx, db.Pool, operations.Filter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 20 || all[0].ID != 20 || all[19].ID != 1 {
		t.Fatalf("admin's default view: %d rows, first %d, last %d; want 20, newest first", len(all), all[0].ID, all[len(all)-1].ID)
	}

	// Pages: newest first, the cursor below the last id, nothing twice.
	seen := map[int64]bool{}
	for before := int64(0); ; {
		page, err := operations.List(ctx, db.Pool, operations.Filter{BeforeID: before, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if seen[r.ID] {
				t.Fatalf("operation %d on two pages", r.ID)
			}
			seen[r.ID] = true
		}
		if len(page) < 7 {
			break
		}
		before = page[len(page)-1].ID
	}
	if len(seen) != 20 {
		t.Fatalf("pages covered %d operations, want 20", len(seen))
	}

	cases := []struct {
		name string
		f    operations.Filter
		want func(operations.Row) bool
	}{
		{"a customer sees only their own", operations.Filter{OwnerID: 2},
			func(r operations.Row) bool { return r.UserID == 2 && r.User == "bob" }},
		{"status", operations.Filter{Status: "FAILED"},
			func(r operations.Row) bool { return r.Status == "FAILED" }},
		{"user by name", operations.Filter{User: "alice"},
			func(r operations.Row) bool { return r.User == "alice" }},
		{"waiting on the provider", operations.Filter{WaitingOn: "provider"},
			func(r operations.Row) bool {
				return r.WaitingOn != nil && *r.WaitingOn == "provider" && *r.Step == "provider_cancel"
			}},
		{"created since and until", operations.Filter{
			Since: time.Date(2026, 1, 1, 0, 5, 0, 0, time.UTC), Until: time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)},
			func(r operations.Row) bool { return r.ID >= 5 && r.ID < 10 }},
		{"finished since", operations.Filter{FinishedSince: time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC)},
			func(r operations.Row) bool { return r.FinishedAt != nil && r.ID >= 15 }},
	}
	for _, tc := range cases {
		tc.f.Limit = 100
		got, err := operations.List(ctx, db.Pool, tc.f)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := 0
		for _, r := range all {
			if tc.want(r) {
				want++
			}
		}
		if len(got) != want || want == 0 {
			t.Errorf("%s: %d rows, want %d (and some)", tc.name, len(got), want)
		}
		for _, r := range got {
			if !tc.want(r) {
				t.Errorf("%s: row %+v does not match", tc.name, r)
			}
		}
	}

	counts, err := operations.Counts(ctx, db.Pool, operations.Filter{OwnerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	byStatus := map[string]int{}
	for _, c := range counts {
		byStatus[c.Status] = c.N
	}
	mine := map[string]int{}
	for _, r := range all {
		if r.UserID == 1 {
			mine[r.Status]++
		}
	}
	for _, s := range operations.Statuses {
		if byStatus[s] != mine[s] {
			t.Errorf("alice's %s: counted %d, listed %d", s, byStatus[s], mine[s])
		}
	}
}

func TestCountsStopAtTheCap(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	seed(t, db, operations.CountCap+2, `'SUCCEEDED'`)
	counts, err := operations.Counts(context.Background(), db.Pool, operations.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		switch {
		case c.Status == "SUCCEEDED" && (c.N != operations.CountCap || !c.AtLeast):
			t.Errorf("SUCCEEDED: %+v, want %d and at_least", c, operations.CountCap)
		case c.Status != "SUCCEEDED" && (c.N != 0 || c.AtLeast):
			t.Errorf("%s: %+v, want 0", c.Status, c)
		}
	}
}
