package web

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/views"
)

// render writes a templ component. It renders into a buffer first, so an
// error half-way through still becomes a clean error page rather than half
// a page with a 200.
func render(c echo.Context, status int, cmp templ.Component) error {
	var buf bytes.Buffer
	if err := cmp.Render(c.Request().Context(), &buf); err != nil {
		return err
	}
	return c.HTMLBlob(status, buf.Bytes())
}

// page fills the layout's view model for this request.
func (app *App) page(c echo.Context, title, nav string) views.Page {
	p := views.Page{Title: title, Nav: nav, CSRF: csrfToken(c), Demo: app.cfg.DemoMode}
	if c.Request().Method == http.MethodGet {
		p.Path = c.Request().URL.Path
	}
	u, ok := userFrom(c)
	if !ok {
		return p
	}
	p.User = &views.User{Name: u.Name, IsAdmin: u.IsAdmin()}
	if p.Demo {
		for _, a := range app.accounts {
			if a.Name != u.Name {
				p.SwitchTo = append(p.SwitchTo, views.Account{Name: a.Name, IsAdmin: a.Role == users.RoleAdmin})
			}
		}
	}
	if u.IsAdmin() {
		p.Waiting, _ = app.desk.CountWaiting(c.Request().Context()) // the badge; 0 if the count fails
		p.Broken = app.brokenNow(c.Request().Context())
		p.BrokerAway = app.brokerAway(c.Request().Context())
	}
	return p
}

// listParams are the pagination parameters every list endpoint accepts:
// ?limit= (default 50, at most 1000) and ?cursor= (opaque, from next_cursor).
type listParams struct {
	Limit   int
	AfterID int64
}

const (
	defaultLimit = 50
	maxLimit     = 1000
)

func parseListParams(c echo.Context) (listParams, error) {
	lp := listParams{Limit: defaultLimit}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return lp, invalidParam("limit", "limit must be a whole number from 1 to 1000")
		}
		lp.Limit = n
	}
	if v := c.QueryParam("cursor"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		id, err2 := strconv.ParseInt(string(b), 10, 64)
		if err != nil || err2 != nil || id < 0 {
			return lp, invalidParam("cursor", "cursor must be a next_cursor value from an earlier page")
		}
		lp.AfterID = id
	}
	return lp, nil
}

func invalidParam(name, detail string) *refusal {
	return refuse(errInvalidParameter, "Invalid parameter", detail).With("parameter", name)
}

// page of a list: the items and the cursor of the next page (null on the last).
type listPage[T any] struct {
	Items      []T     `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

// newListPage takes up to limit+1 rows (the extra one only says "there is
// more") and the id of each row.
func newListPage[T any](rows []T, limit int, id func(T) int64) listPage[T] {
	lp := listPage[T]{Items: rows}
	if lp.Items == nil {
		lp.Items = []T{}
	}
	if len(rows) > limit {
		lp.Items = rows[:limit]
		cur := base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(id(rows[limit-1]), 10)))
		lp.NextCursor = &cur
	}
	return lp
}

// pathID reads a path parameter that names a row: a positive decimal
// int64 (no sign, no spaces, no overflow). Anything else names nothing: 404,
// before any workflow runs, so a keyed route claims and stores nothing.
func pathID(c echo.Context, name string) (int64, error) {
	id, err := parseID(c.Param(name))
	if err != nil {
		return 0, refuse(errNoSuchResource, "Not found", "no "+name+" with that id")
	}
	return id, nil
}

var errBadID = errors.New("not an id")

// parseID is pathID's rule: 1 to 19 ASCII digits, value 1 to 2^63-1.
func parseID(s string) (int64, error) {
	if s == "" || len(s) > 19 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errBadID
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, errBadID
	}
	return id, nil
}
