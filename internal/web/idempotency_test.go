package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
)

// The 409 a form's repeat gets while its key is held is the same whether the
// first submission is running or died in a crash (its lease then holds the
// key until it runs out): the page must not say the first is "still being
// processed", which a crash makes false (issue 29, second read, finding 11).
func TestInProgressNoticeIsTrueAfterACrash(t *testing.T) {
	app := &App{}
	e := echo.New()
	rec := httptest.NewRecorder()
	c := e.NewContext(httptest.NewRequest(http.MethodPost, "/policies/1/cancel", nil), rec)
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
	for _, must := range []string{"lease runs out", "Try again after that"} {
		if !strings.Contains(body, must) {
			t.Errorf("the notice does not say %q", must)
		}
	}
}
