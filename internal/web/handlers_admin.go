package web

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/events"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/views"
)

// handleGetCrash: GET /api/v1/admin/crash — the crash point in force.
func (app *App) handleGetCrash(c echo.Context) error {
	return c.JSON(http.StatusOK, app.crash.Setting())
}

// handlePutCrash: PUT /api/v1/admin/crash {"at": "after_provider_call",
// "mode": "abandon", "once": true} — arm a crash point on this instance
// ({"at": ""} disarms it). Setting a value is idempotent by nature, so the
// route takes no Idempotency-Key.
func (app *App) handlePutCrash(c echo.Context) error {
	var s crash.Setting
	if err := decodeOptionalJSON(c, &s); err != nil {
		return err
	}
	if err := app.crash.Arm(s); err != nil {
		return refuse(errInvalidCrashPoint, "Invalid crash point", err.Error())
	}
	return c.JSON(http.StatusOK, app.crash.Setting())
}

// handleCrashForm: POST /admin/crash (admin, demo mode only) — the demo
// page's "crash at": arm a point once, in abandon mode, so the next request
// that passes it is cut off and leaves what a killed process leaves, while
// the server stays up; at="" disarms. Then back to the page.
func (app *App) handleCrashForm(c echo.Context) error {
	s := crash.Setting{At: crash.Point(c.FormValue("at")), Mode: crash.Abandon, Once: true}
	if !inRequest(s.At) {
		return refuse(errCrashPointNotHere, "Invalid crash point",
			fmt.Sprintf("%q is passed by a background loop, not a request: abandoning there takes the process down; arm it with PUT /api/v1/admin/crash", s.At))
	}
	if err := app.crash.Arm(s); err != nil {
		return refuse(errCrashPointNotHere, "Invalid crash point", err.Error())
	}
	u, _ := userFrom(c)
	logFrom(c.Request().Context()).Warn("crash point armed from the demo page", "by", u.Name, "at", s.At)
	return c.Redirect(http.StatusSeeOther, "/admin/demo#crash")
}

// inRequest says whether a request passes p, so that abandoning there cuts
// off only that request: the relay's and the consumers' points are passed
// by background loops.
func inRequest(p crash.Point) bool {
	return p != events.CrashRelayAfterPublishBeforeMark && p != events.CrashConsumerAfterCommitBeforeAck
}

// handleEndLease: POST /api/v1/admin/operations/:id/end-lease (admin, demo
// mode only) — end a live operation's lease now, as if its owner had gone
// silent, so that recovery claims it at its next pass. 409 no-live-lease
// when it has none running. Ending a lease that has ended changes nothing,
// so it takes no Idempotency-Key.
func (app *App) handleEndLease(c echo.Context) error {
	id, err := app.endLease(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"operation_id": id, "lease": "ended"})
}

// handleEndLeaseForm: POST /admin/operations/:id/end-lease — the recovery
// page's "Let its lease run out now"; then the operation's page, where the
// claim appears.
func (app *App) handleEndLeaseForm(c echo.Context) error {
	id, err := app.endLease(c)
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, fmt.Sprintf("/operations/%d", id))
}

func (app *App) endLease(c echo.Context) (int64, error) {
	id, err := pathID(c, "id")
	if err != nil {
		return 0, err
	}
	u, _ := userFrom(c)
	return id, labs.EndLease(c.Request().Context(), app.pool, id, u.Name+" (demo control)")
}

// handleReset: POST /api/v1/admin/reset {"users": U, "policies_per_user": P,
// "slots": S, "deposit_slots": D} — wipe and reseed a repeatable data set, and reset the
// fakes (provider and payments). Demo mode only (routes.go). The same reset twice leaves the
// same state, so it takes no Idempotency-Key.
func (app *App) handleReset(c echo.Context) error {
	d, unset := demo.DefaultDataset(), -1
	d.DepositSlots = unset
	if err := decodeOptionalJSON(c, &d); err != nil {
		return err
	}
	if d.DepositSlots == unset {
		// The demo's week of deposit slots comes with the demo's slots; a
		// dataset sized for a load test has none unless it asks.
		d.DepositSlots = 0
		if d.Slots == demo.SeededSlots {
			d.DepositSlots = demo.DefaultDataset().DepositSlots
		}
	}
	accounts, err := app.resetDemo(c, d)
	if err != nil {
		return err
	}
	type account struct {
		Name  string `json:"name"`
		Role  string `json:"role"`
		Token string `json:"token"`
	}
	out := struct {
		Dataset demo.Dataset `json:"dataset"`
		Users   []account    `json:"users"`
	}{Dataset: d, Users: make([]account, len(accounts))}
	for i, a := range accounts {
		out.Users[i] = account{a.Name, a.Role, a.Token}
	}
	return c.JSON(http.StatusOK, out)
}

// resetDemo is the one reset behind the API and the demo page: the data
// (demo.Reset), then both fakes, then what the app believes about them —
// the fakes' defaults are idempotent, so the belief goes back to that too —
// and the crash switch, disarmed: a point left armed would cut off the
// first request of the clean demo.
func (app *App) resetDemo(c echo.Context, d demo.Dataset) ([]demo.Account, error) {
	ctx := c.Request().Context()
	accounts, err := demo.Reset(ctx, app.pool, app.accounts, d, time.Now(), demo.TokenFor(app.secret))
	var bad *demo.DatasetError
	if errors.As(err, &bad) {
		return nil, refuse(errValidation, "Invalid dataset",
			fmt.Sprintf("%s must be %d to %d", bad.Field, bad.Min, bad.Max)).With("field", bad.Field)
	}
	if err != nil {
		return nil, err
	}
	u, _ := userFrom(c)
	for _, fake := range []fakeAdmin{app.providerAdmin(), app.paymentsAdmin()} {
		if err := fake.control.Reset(ctx); err != nil {
			return nil, fake.controlError(c, err)
		}
		if err := fake.believe(ctx, true, u.Name+" (the demo reset)"); err != nil {
			return nil, err
		}
	}
	if app.crash != nil {
		if err := app.crash.Arm(crash.Setting{}); err != nil {
			return nil, err
		}
	}
	app.broken.forget() // the data the last check saw is gone
	logFrom(ctx).Warn("data reset", "by", u.Name, "users", len(accounts), "policies_per_user", d.PoliciesPerUser, "slots", d.Slots)
	return accounts, nil
}

// handleDemoPage: GET /admin/demo (admin, demo mode only) — the data reset
// behind a confirmation, and the demo accounts with their API tokens.
func (app *App) handleDemoPage(c echo.Context) error {
	d := demo.DefaultDataset()
	vm := views.DemoView{Policies: d.PoliciesPerUser * customers(app.accounts), Slots: d.Slots + d.DepositSlots, Done: c.QueryParam("done") == "1",
		Armed: string(app.crash.Setting().At)}
	for _, p := range app.crash.Known() {
		if inRequest(p) {
			vm.Points = append(vm.Points, string(p))
		}
	}
	for _, a := range app.accounts {
		vm.Accounts = append(vm.Accounts, views.DemoAccount{Name: a.Name, Role: a.Role, Token: a.Token})
	}
	return render(c, http.StatusOK, views.DemoPage(app.page(c, "Demo controls", ""), vm))
}

// handleResetForm: POST /admin/reset (admin, demo mode only) — the demo
// page's reset, with confirm=reset ticked (422 otherwise, nothing
// changed). The reset ends every session, this one too, so the admin who
// pressed it gets a new one; then POST/redirect/GET to the page. It takes
// no idempotency key, like the API: the reset empties the key store
// itself, and the same reset twice leaves the same data.
func (app *App) handleResetForm(c echo.Context) error {
	if c.FormValue("confirm") != "reset" {
		return refuse(errConfirmationRequired, "Confirm the reset",
			"tick the box that says you understand the reset deletes everything, then press Reset again; nothing was changed")
	}
	if _, err := app.resetDemo(c, demo.DefaultDataset()); err != nil {
		return err
	}
	u, _ := userFrom(c)
	again, err := app.users.ByName(c.Request().Context(), u.Name)
	if err != nil {
		return err
	}
	c.Set(sessionIDKey, nil) // that session is gone with the reset
	if err := app.signIn(c, again); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/demo?done=1")
}

// customers counts the customer accounts (each owns the dataset's policies).
func customers(accounts []demo.Account) int {
	n := 0
	for _, a := range accounts {
		if a.Role == users.RoleCustomer {
			n++
		}
	}
	return n
}

// handleInvariants: GET /api/v1/invariants[?stale_after=90s] — every
// invariant of docs/invariants.md checked with SQL, read-only, cheap enough to poll
// during a load test. stale_after is invariant 6's bound: how long a live
// operation may stay claimable before it counts as stuck (default:
// recovery's bound plus a minute, staleAfter; "0" reports stale operations
// only in counts).
func (app *App) handleInvariants(c echo.Context) error {
	staleAfter := app.staleAfter()
	if v := c.QueryParam("stale_after"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return invalidParam("stale_after", "stale_after must be a duration such as 90s")
		}
		staleAfter = d
	}
	r, err := invariants.Check(c.Request().Context(), app.pool, invariants.Options{StaleAfter: staleAfter, Retention: app.cfg.OperationsRetention})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}
