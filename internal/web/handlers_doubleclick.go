package web

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/views"
)

// handleDoubleClickLab: POST /policies/:id/double-click — the double-click
// lab. It sends the policy's cancel form twice at once through this very
// server (session, CSRF, idempotency middleware, handler — nothing is
// simulated), with the same key or with two keys, and reports what each
// layer did: the request key (Idempotency-Key) and the business constraint
// UNIQUE(policy_id, operation_type).
func (app *App) handleDoubleClickLab(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	pol, err := app.policies.Get(ctx, u.ID, id)
	if err != nil {
		return err
	}
	sameKey := c.FormValue("mode") != "two-keys"
	keys := []string{newFormKey(), newFormKey()}
	if sameKey {
		keys[1] = keys[0]
	}

	clicks := make([]views.LabClick, 2)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clicks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start // both clicks leave together
			clicks[i] = app.click(c, pol.ID, keys[i])
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()

	res := views.LabResult{SameKey: sameKey, Clicks: clicks, Elapsed: time.Since(began).Round(time.Millisecond).String()}
	if err := app.describeLayers(ctx, u.ID, pol.ID, keys, &res); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.DoubleClickResult(res))
}

// click submits the cancel form once, in-process, as the current browser.
// A crash point armed to abandon the request (demo controls) cuts it off
// with http.ErrAbortHandler, which net/http recovers only on the goroutine
// it serves from: here, on the click's own, it would end the process — so
// the click recovers it and reports a request that got no answer, as a
// browser would see it.
func (app *App) click(c echo.Context, policyID int64, key string) (click views.LabClick) {
	form := url.Values{"_csrf": {csrfToken(c)}, "idempotency_key": {key}, "reason": {"double-click lab"}}
	req := httptest.NewRequestWithContext(context.WithoutCancel(c.Request().Context()),
		http.MethodPost, fmt.Sprintf("/policies/%d/cancel", policyID), strings.NewReader(form.Encode()))
	req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationForm)
	// The same browser: its session and CSRF cookies, its address and what
	// a trusted proxy said about it (the cookies' names depend on the scheme).
	req.RemoteAddr = c.Request().RemoteAddr
	for _, h := range []string{"Cookie", echo.HeaderXForwardedFor, echo.HeaderXForwardedProto} {
		if v := c.Request().Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	rec := httptest.NewRecorder()
	began := time.Now()
	defer func() {
		if r := recover(); r != nil {
			if r != http.ErrAbortHandler {
				panic(r)
			}
			click = views.LabClick{Key: key, CutOff: true, Took: time.Since(began).Round(time.Millisecond).String()}
		}
	}()
	app.handler.ServeHTTP(rec, req)
	return views.LabClick{
		Key:      key,
		Status:   rec.Code,
		Location: rec.Header().Get(echo.HeaderLocation),
		Replayed: rec.Header().Get("Idempotent-Replayed") == "true",
		Took:     time.Since(began).Round(time.Millisecond).String(),
	}
}

// describeLayers reads what the two clicks left in the database.
func (app *App) describeLayers(ctx context.Context, userID, policyID int64, keys []string, res *views.LabResult) error {
	err := app.pool.QueryRow(ctx, `
		SELECT count(*)
		  FROM idempotency_keys
		 WHERE user_id = $1
		   AND idempotency_key = ANY($2)`, userID, keys).Scan(&res.KeyRows)
	if err != nil {
		return err
	}
	err = app.pool.QueryRow(ctx, `
		SELECT count(*), coalesce(max(status), '')
		  FROM operations
		 WHERE policy_id = $1`, policyID).Scan(&res.Operations, &res.OperationStatus)
	if err != nil {
		return err
	}
	err = app.pool.QueryRow(ctx, `
		SELECT count(*)
		  FROM fake_provider.effects
		 WHERE policy_id = $1`, policyID).Scan(&res.Effects)
	return err
}
