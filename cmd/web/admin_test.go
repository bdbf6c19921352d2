package main

import (
	"bytes"
	"context"
	"testing"
)

func TestInvariantsEndpointAndReset(t *testing.T) {
	t.Parallel()
	s := startServer(t, nil)
	if r := s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-alice"}); r.Status != 403 {
		t.Fatalf("customer: %d", r.Status)
	}
	s.do(cancelReq(s.policyOf(t, "demo-alice", 0), "demo-alice", "k1", ""))
	var rep struct {
		OK         bool `json:"ok"`
		Violations []struct {
			Invariant int     `json:"invariant"`
			IDs       []int64 `json:"ids"`
		} `json:"violations"`
		Counts struct {
			OperationsByStatus map[string]int `json:"operations_by_status"`
			Effects            int            `json:"effects"`
		} `json:"counts"`
	}
	s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"}).JSON(t, &rep)
	if !rep.OK || rep.Counts.OperationsByStatus["SUCCEEDED"] != 1 || rep.Counts.Effects != 1 {
		t.Fatalf("after one cancellation: %+v", rep)
	}
	// Break invariant 4 behind the app's back: the endpoint must say so.
	s.DB.Pool.Exec(context.Background(), `UPDATE policies SET status = 'CANCELLED' WHERE id = (SELECT max(id) FROM policies)`)
	s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"}).JSON(t, &rep)
	if rep.OK || len(rep.Violations) != 1 || rep.Violations[0].Invariant != 4 {
		t.Fatalf("broken invariant 4 not reported: %+v", rep)
	}
	if r := s.do(request{Method: "GET", Path: "/api/v1/invariants?stale_after=soon", Token: "demo-admin"}); r.Status != 400 {
		t.Fatalf("bad stale_after: %d", r.Status)
	}

	// Reset wipes it all and reseeds; demo tokens keep working.
	var out struct {
		Users []struct{ Name, Token string } `json:"users"`
	}
	r := s.do(request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `{"users": 10, "policies_per_user": 2, "slots": 20}`})
	if r.Status != 200 {
		t.Fatalf("reset: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &out)
	if len(out.Users) != 14 {
		t.Fatalf("reset users: %d", len(out.Users))
	}
	again := s.do(request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `{"users": 10, "policies_per_user": 2, "slots": 20}`})
	if !bytes.Equal(again.Body, r.Body) {
		t.Fatalf("the same reset twice gave different answers:\n%s\n%s", r.Body, again.Body)
	}
	last := out.Users[len(out.Users)-1]
	var page pageJSON[policyJSON]
	s.do(request{Method: "GET", Path: "/api/v1/policies", Token: last.Token}).JSON(t, &page)
	if len(page.Items) != 2 {
		t.Fatalf("%s sees %d policies", last.Name, len(page.Items))
	}
	rep.Counts.OperationsByStatus = nil // decoding merges into an existing map
	s.do(request{Method: "GET", Path: "/api/v1/invariants", Token: "demo-admin"}).JSON(t, &rep)
	if !rep.OK || rep.Counts.Effects != 0 || len(rep.Counts.OperationsByStatus) != 0 {
		t.Fatalf("after reset: %+v", rep)
	}
	if r := s.do(request{Method: "POST", Path: "/api/v1/admin/reset", Token: "demo-admin", Body: `{"slots": 0}`}); r.Status != 422 {
		t.Fatalf("bad dataset: %d %s", r.Status, r.Body)
	}
}

// Outside demo mode the reset and the crash switch do not exist.
func TestResetAndCrashSwitchAreDemoOnly(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"DEMO_MODE": "false"})
	for _, rq := range []request{
		{Method: "POST", Path: "/api/v1/admin/reset"},
		{Method: "GET", Path: "/api/v1/admin/crash"},
		{Method: "PUT", Path: "/api/v1/admin/crash", Body: `{"at":"after_claim"}`},
	} {
		if r := s.do(rq); r.Status != 404 || r.problemType() != "not-found" {
			t.Errorf("%s %s outside demo mode: %d %s, want 404", rq.Method, rq.Path, r.Status, r.Body)
		}
	}
}
