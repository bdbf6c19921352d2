package web

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/operations"
)

// This file is waiting for an outcome: Prefer: wait=N (RFC 7240) on
// GET /api/v1/operations/{id} and on the keyed POSTs that answer 202, and
// the header that tells a 202 — first answer or replay — where its
// operation stands now (docs/idempotency.md, "the draft's open questions,
// answered").

// OperationStatusHeader carries, on a 202 whose Location is an operation,
// that operation's status when the answer was sent. The stored answer's
// status and body are replayed byte for byte; this header is not part of
// them.
const OperationStatusHeader = "Operation-Status"

// preferredWait reads RFC 7240's wait preference from the Prefer headers:
// "Prefer: wait=10", possibly among other preferences. A value that is not
// a number of seconds is ignored, as RFC 7240 says a preference the server
// does not understand is; a longer one is capped at operations.MaxWait.
func preferredWait(h http.Header) (time.Duration, bool) {
	for _, line := range h.Values("Prefer") {
		for _, pref := range strings.Split(line, ",") {
			token, _, _ := strings.Cut(pref, ";") // no parameters are defined for wait
			name, value, found := strings.Cut(strings.TrimSpace(token), "=")
			if !found || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(value), `"`))
			if err != nil || n < 0 {
				return 0, false
			}
			return min(time.Duration(n)*time.Second, operations.MaxWait), true
		}
	}
	return 0, false
}

// waitFor waits, when the request prefers to, for operation id to become
// final, and says so in Preference-Applied. It returns whether it waited.
func (app *App) waitFor(c echo.Context, id int64) bool {
	d, ok := preferredWait(c.Request().Header)
	if !ok || app.waiter == nil {
		return false
	}
	c.Response().Header().Add(echo.HeaderVary, "Prefer")
	if _, err := app.waiter.Wait(c.Request().Context(), id, d); err != nil {
		return false // not waited: the answer says what is known now
	}
	c.Response().Header().Set("Preference-Applied", "wait="+strconv.Itoa(int(d/time.Second)))
	return true
}

// answerWithOperationState is the middleware of keyed routes that answer
// 202 Accepted + Location: /api/v1/operations/{id} when an outcome is not
// known yet. Just before such an answer is written — the first or a replay —
// it waits for the operation when the request prefers to, then adds
// Operation-Status with where the operation stands now. The stored answer
// itself is not touched: its status and body are the same bytes every time.
func (app *App) answerWithOperationState(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		res := c.Response()
		res.Before(func() {
			if res.Status != http.StatusAccepted {
				return
			}
			id, ok := operationIDIn(res.Header().Get(echo.HeaderLocation))
			if !ok {
				id, ok = operationIDIn(monitored(res.Header().Get("Link")))
			}
			if !ok {
				return
			}
			app.waitFor(c, id)
			// Read after the wait, and even when the client has gone: the
			// header is written either way.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), 2*time.Second)
			defer cancel()
			if status, err := app.operationStatus(ctx, id); err == nil {
				res.Header().Set(OperationStatusHeader, status)
			}
		})
		return next(c)
	}
}

// monitorLink names the operation a 202 whose Location is not an operation
// (a booking's) waits on: Link: </api/v1/operations/7>; rel="monitor".
func monitorLink(id int64) string {
	return "<" + operationURL(id) + `>; rel="monitor"`
}

// monitored is the target of monitorLink's header, or "".
func monitored(link string) string {
	target, rel, _ := strings.Cut(link, ";")
	if strings.TrimSpace(rel) != `rel="monitor"` {
		return ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(target), "<"), ">")
}

// operationIDIn reads the id of a Location /api/v1/operations/{id}.
func operationIDIn(location string) (int64, bool) {
	rest, ok := strings.CutPrefix(location, "/api/v1/operations/")
	if !ok {
		return 0, false
	}
	id, err := parseID(rest)
	return id, err == nil
}

// operationStatus is an operation's status now, read by id alone: the
// caller's answer already named the operation, so it is theirs to see.
func (app *App) operationStatus(ctx context.Context, id int64) (string, error) {
	return operations.Status(ctx, app.pool, id)
}
