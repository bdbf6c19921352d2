package web

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/views"
)

// operationsPage is GET /api/v1/operations's answer: a page of the list and
// the counts per status of everything its filters select.
type operationsPage struct {
	listPage[operations.Row]
	Counts []operations.Count `json:"counts"`
}

// operationsFilter reads the list's filters from the query: status, kind,
// user, waiting_on, since, until, finished_since, finished_until, and the
// pagination every list takes. A customer's list is always their own.
func (app *App) operationsFilter(c echo.Context) (operations.Filter, int, error) {
	u, _ := userFrom(c)
	lp, err := parseListParams(c)
	if err != nil {
		return operations.Filter{}, 0, err
	}
	f := operations.Filter{BeforeID: lp.AfterID, Limit: lp.Limit + 1}
	if !u.IsAdmin() {
		f.OwnerID = u.ID
	}
	q := c.QueryParams()
	if f.Status = q.Get("status"); f.Status != "" && !slices.Contains(operations.Statuses, f.Status) {
		return f, 0, invalidParam("status", "status must be one of IN_PROGRESS, RECOVERING, SUCCEEDED, FAILED, NEEDS_RECONCILIATION")
	}
	if f.Kind = q.Get("kind"); f.Kind != "" && !slices.Contains(app.engine.Types(), f.Kind) {
		return f, 0, invalidParam("kind", "kind must be an operation type: CANCEL (policy cancellation), BOOK_DEPOSIT (deposit booking) or CANCEL_DEPOSIT (deposit cancellation)")
	}
	if f.User = q.Get("user"); len(f.User) > 100 || validText("user", f.User, 100) != nil {
		return f, 0, invalidParam("user", "user must be a user's name: text of at most 100 bytes, no control characters")
	}
	if f.WaitingOn = q.Get("waiting_on"); !systemName(f.WaitingOn) {
		return f, 0, invalidParam("waiting_on", "waiting_on must name an external system, such as provider or payments")
	}
	for _, t := range []struct {
		name string
		into *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}, {"finished_since", &f.FinishedSince}, {"finished_until", &f.FinishedUntil}} {
		v := q.Get(t.name)
		if v == "" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || at.Year() < 1 || at.Year() > 9999 {
			return f, 0, invalidParam(t.name, t.name+" must be a time in RFC 3339, such as 2026-12-03T18:00:00Z")
		}
		*t.into = at
	}
	return f, lp.Limit, nil
}

// systemName: empty, or a lowercase name of at most 40 letters and _.
func systemName(s string) bool {
	if len(s) > 40 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && r != '_' {
			return false
		}
	}
	return true
}

// listOperations reads what both renderings of the list show: the filter
// the query asks for, one page of rows (limit + 1, for the cursor) and the
// counts per status under the same filter.
func (app *App) listOperations(c echo.Context) (operations.Filter, int, []operations.Row, []operations.Count, error) {
	f, limit, err := app.operationsFilter(c)
	if err != nil {
		return f, 0, nil, nil, err
	}
	ctx := c.Request().Context()
	rows, err := operations.List(ctx, app.pool, f)
	if err != nil {
		return f, 0, nil, nil, err
	}
	counts, err := operations.Counts(ctx, app.pool, f)
	return f, limit, rows, counts, err
}

// handleListOperations: GET /api/v1/operations — every operation for an
// admin, the caller's own for a customer; newest first, filtered,
// paginated, with the counts per status.
func (app *App) handleListOperations(c echo.Context) error {
	_, limit, rows, counts, err := app.listOperations(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, operationsPage{
		listPage: newListPage(rows, limit, func(r operations.Row) int64 { return r.ID }),
		Counts:   counts,
	})
}

// handleOperationsPage: GET /operations — the same list as a page: the
// counts, each a link to its filter, the filters as a form, each row a
// link to its operation's page.
func (app *App) handleOperationsPage(c echo.Context) error {
	f, limit, rows, counts, err := app.listOperations(c)
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	q := c.QueryParams()
	vm := views.OperationsView{
		Admin: u.IsAdmin(), Status: f.Status, Kind: f.Kind, User: f.User, WaitingOn: f.WaitingOn,
		Since: q.Get("since"), Until: q.Get("until"),
	}
	for _, k := range app.engine.Types() {
		vm.Kinds = append(vm.Kinds, views.Choice{Value: k, Label: kindWords(k)})
	}
	for _, cnt := range counts {
		n := strconv.Itoa(cnt.N)
		if cnt.AtLeast {
			n += "+"
		}
		vm.Counts = append(vm.Counts, views.OperationsCount{
			Status: cnt.Status, N: n, Current: cnt.Status == f.Status,
			Href: operationsHref(q, "status", cnt.Status),
		})
	}
	page := newListPage(rows, limit, func(r operations.Row) int64 { return r.ID })
	for _, r := range page.Items {
		row := views.OperationsRow{
			ID: r.ID, Kind: kindWords(r.Kind), Subject: subjectOf(r), User: r.User, Status: r.Status,
			Created: r.CreatedAt.UTC().Format("2 Jan 15:04:05"),
		}
		if r.FinishedAt != nil {
			row.Finished = r.FinishedAt.UTC().Format("2 Jan 15:04:05")
		}
		if r.WaitingOn != nil {
			row.Waiting = *r.WaitingOn + " (" + *r.Step + ")"
		}
		vm.Rows = append(vm.Rows, row)
	}
	if page.NextCursor != nil {
		vm.Older = operationsHref(q, "cursor", *page.NextCursor)
	}
	if f.Status != "" {
		vm.AllHref = operationsHref(q, "status", "")
	}
	return render(c, http.StatusOK, views.OperationsPage(app.page(c, "Operations", "operations"), vm))
}

// operationsHref is the list's URL with the query q, name set to value
// ("" removes it) and the cursor dropped unless it is what is set.
func operationsHref(q url.Values, name, value string) string {
	next := url.Values{}
	for k, v := range q {
		if k != "cursor" {
			next[k] = v
		}
	}
	next.Del(name)
	if value != "" {
		next.Set(name, value)
	}
	if len(next) == 0 {
		return "/operations"
	}
	return "/operations?" + next.Encode()
}

// kindWords names an operation type as a person says it.
func kindWords(operationType string) string {
	switch operationType {
	case "CANCEL":
		return "Policy cancellation"
	case "BOOK_DEPOSIT":
		return "Deposit booking"
	case "CANCEL_DEPOSIT":
		return "Deposit cancellation"
	}
	return operationType
}

func subjectOf(r operations.Row) string {
	if r.BookingID != 0 {
		return "booking " + strconv.FormatInt(r.BookingID, 10)
	}
	return "policy " + strconv.FormatInt(r.PolicyID, 10)
}
