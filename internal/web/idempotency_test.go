package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/users"
)

// The 409 a form's repeat gets while its key is held is the same whether the
// first submission is running or died in a crash (its lease then holds the
// key until it runs out): the page must not say the first is "still being
// processed", which a crash makes false (issue 29, second read, finding 11).
//
// A customer reads it without the lease, the operators' word (redact.go;
// issue 29, the third reader's finding 5); an admin reads the lease.
func TestInProgressNoticeIsTrueAfterACrash(t *testing.T) {
	notice := func(u users.User) string {
		t.Helper()
		app := &App{}
		e := echo.New()
		rec := httptest.NewRecorder()
		c := e.NewContext(httptest.NewRequest(http.MethodPost, "/policies/1/cancel", nil), rec)
		c.Set(userKey, u)
		refusal := &idempotency.Refusal{Err: idempotency.ErrInProgress, Detail: "held"}
		if err := app.formNotice(c, refusal); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusConflict {
			t.Errorf("status %d, want 409", rec.Code)
		}
		body := rec.Body.String()
		for _, wrong := range []string{"still being processed", "Still working"} {
			if strings.Contains(body, wrong) {
				t.Errorf("the notice says %q, false when the first submission died", wrong)
			}
		}
		return body
	}
	customer := notice(users.User{Name: "alice", Role: users.RoleCustomer})
	if strings.Contains(customer, "lease") || !strings.Contains(customer, "if it was cut off") || !strings.Contains(customer, "Try again") {
		t.Errorf("a customer's notice: %q", customer)
	}
	if admin := inProgressMessage(true); !strings.Contains(admin, "lease runs out") || !strings.Contains(admin, "Try again after that") {
		t.Errorf("the admin's notice: %q", admin)
	}
}
