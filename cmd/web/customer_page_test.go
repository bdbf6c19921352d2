package main

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/provider/fake"
)

// The operation page follows the API's one redaction rule (issue 29, the
// third reader's finding 5): bob's cancellation, its provider answering 503
// and its status queries failing too, read by bob on the page and in its
// htmx panel, shows no HTTP status, no raw JSON answer, no SQL, no code
// location and no instance name — while the admin's same page shows them,
// so the operation has them to leak.
func TestACustomersOperationPageShowsNoRawDetail(t *testing.T) {
	t.Parallel()
	s := startServer(t, map[string]string{"PROVIDER_TIMEOUT": "2s", "RECOVERY_INTERVAL": "1h", "INSTANCE_ID": "host-secret-7"})
	s.setFaults(t, func(f *fake.Fault) { f.Mode, f.StatusMode = fake.ModeError, fake.StatusError })
	r := s.do(cancelReq(s.policyOf(t, "demo-bob", 0), "demo-bob", newKey(), ""))
	if r.Status != http.StatusAccepted {
		t.Fatalf("bob's cancellation: %d %s", r.Status, r.Body)
	}
	var answer struct {
		ID int64 `json:"id"`
	}
	r.JSON(t, &answer)
	op := answer.ID
	var token string
	if err := s.DB.Pool.QueryRow(context.Background(), `SELECT owner_token::text FROM operations WHERE id = $1`, op).Scan(&token); err != nil {
		t.Fatal(err)
	}
	raw := []string{token[:8], "HTTP 503", "503", `"outcome"`, `"error": "`, "SELECT", "UPDATE ", ".go:", "host-secret-7", "written by", "/code/internal"}

	read := func(name, path string) string {
		t.Helper()
		client := s.browserClient()
		s.signIn(t, client, name)
		got := doWith(t, client, s.URL, request{Method: "GET", Path: path})
		if got.Status != http.StatusOK {
			t.Fatalf("%s GET %s: %d", name, path, got.Status)
		}
		return string(got.Body)
	}
	page := fmt.Sprintf("/operations/%d", op)
	admin := read("admin", page)
	for _, must := range []string{"503", "host-secret-7", ".go:"} {
		if !strings.Contains(admin, must) {
			t.Errorf("the admin's page lacks %q: the operation has nothing to leak", must)
		}
	}
	// Finding 6: every breadcrumb link on the admin's page of bob's
	// operation opens for the admin (a policy's page is bob's alone).
	nav := admin[strings.Index(admin, `aria-label="breadcrumb"`):]
	nav = nav[:strings.Index(nav, "</nav>")]
	for _, m := range regexp.MustCompile(`href="([^"]+)"`).FindAllStringSubmatch(nav, -1) {
		client := s.browserClient()
		s.signIn(t, client, "admin")
		if got := doWith(t, client, s.URL, request{Method: "GET", Path: m[1]}); got.Status != http.StatusOK {
			t.Errorf("the admin's breadcrumb links %s: %d", m[1], got.Status)
		}
	}
	for _, path := range []string{page, page + "/panel"} {
		body := read("bob", path)
		for _, bad := range raw {
			if strings.Contains(body, bad) {
				i := strings.Index(body, bad)
				t.Errorf("bob's %s shows %q: …%s…", path, bad, body[max(0, i-120):min(len(body), i+80)])
			}
		}
	}
}
