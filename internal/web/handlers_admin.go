package web

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/crash"
	"github.com/idemlab/idemlab/internal/demo"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/problem"
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
		return problem.New(http.StatusBadRequest, "invalid-crash-point", "Invalid crash point", err.Error())
	}
	return c.JSON(http.StatusOK, app.crash.Setting())
}

// handleReset: POST /api/v1/admin/reset {"users": U, "policies_per_user": P,
// "slots": S, "deposit_slots": D} — wipe and reseed a repeatable data set, and reset the
// fakes (provider and payments). Demo mode only (routes.go). The same reset twice leaves the
// same state, so it takes no Idempotency-Key.
func (app *App) handleReset(c echo.Context) error {
	defaultSlots, unset := 7*8*len(demo.Resources), -1
	d := demo.Dataset{Users: 0, PoliciesPerUser: demo.PoliciesPerCustomer, Slots: defaultSlots, DepositSlots: unset}
	if err := decodeOptionalJSON(c, &d); err != nil {
		return err
	}
	if d.DepositSlots == unset {
		// The demo's week of deposit slots comes with the demo's slots; a
		// dataset sized for a load test has none unless it asks.
		d.DepositSlots = 0
		if d.Slots == defaultSlots {
			d.DepositSlots = 7 * 8
		}
	}
	ctx := c.Request().Context()
	accounts, err := demo.Reset(ctx, app.pool, app.accounts, d, time.Now(), demo.TokenFor(app.secret))
	var bad *demo.DatasetError
	if errors.As(err, &bad) {
		return problem.New(http.StatusUnprocessableEntity, "validation-failed", "Invalid dataset",
			fmt.Sprintf("%s must be %d to %d", bad.Field, bad.Min, bad.Max)).With("field", bad.Field)
	}
	if err != nil {
		return err
	}
	for _, fake := range []fakeAdmin{app.providerAdmin(), app.paymentsAdmin()} {
		if err := fake.control.Reset(ctx); err != nil {
			return fake.controlError(c, err)
		}
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
	logFrom(ctx).Warn("data reset", "users", len(accounts), "policies_per_user", d.PoliciesPerUser, "slots", d.Slots)
	return c.JSON(http.StatusOK, out)
}

// handleInvariants: GET /api/v1/invariants[?stale_after=90s] — every
// invariant of docs/invariants.md checked with SQL, read-only, cheap enough to poll
// during a load test. stale_after is invariant 6's bound: how long past its
// lease a live operation may be before it counts as stuck (default: twice
// OPERATION_LEASE plus a minute; "0" reports stale operations only in counts).
func (app *App) handleInvariants(c echo.Context) error {
	staleAfter := 2*app.cfg.OperationLease + time.Minute
	if v := c.QueryParam("stale_after"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return invalidParam("stale_after", "stale_after must be a duration such as 90s")
		}
		staleAfter = d
	}
	r, err := invariants.Check(c.Request().Context(), app.pool, invariants.Options{StaleAfter: staleAfter})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}
