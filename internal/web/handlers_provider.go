package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/views"
)

// The provider's own part of its control surface (the shared part is
// handlers_fakes.go): its effects ledger and its page.

// handleGetProviderEffects: GET /api/v1/provider/effects (admin) — the
// effects ledger: {"total", "pending", "by_policy": [{"policy_id", "count",
// "pending"}], "late": {"total", "recent"}}. A count above 1 is a double
// cancellation; "late" (left out when empty) lists calls refused for
// arriving after their deadline.
func (app *App) handleGetProviderEffects(c echo.Context) error {
	e, err := app.providerControl.Effects(c.Request().Context())
	if err != nil {
		return app.providerAdmin().controlError(c, err)
	}
	return c.JSON(http.StatusOK, e)
}

// subjects are the policies and bookings a customer owns: what the fakes'
// ledgers show them.
type subjects struct {
	policies, bookings map[int64]bool
}

// ownSubjects returns the signed-in customer's policies and bookings, or
// nil for an admin, who sees every line.
func (app *App) ownSubjects(c echo.Context) (*subjects, error) {
	u, _ := userFrom(c)
	if u.IsAdmin() {
		return nil, nil
	}
	ctx := c.Request().Context()
	own := &subjects{policies: map[int64]bool{}, bookings: map[int64]bool{}}
	ps, err := app.policies.List(ctx, policies.ListFilter{UserID: u.ID, Limit: maxOwnSubjects})
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		own.policies[p.ID] = true
	}
	bs, err := app.slots.ListBookings(ctx, slots.BookingFilter{UserID: u.ID, Limit: maxOwnSubjects})
	if err != nil {
		return nil, err
	}
	for _, b := range bs {
		own.bookings[b.ID] = true
	}
	return own, nil
}

// has reports whether a ledger line about policyID or bookingID is the
// customer's; every line is an admin's (s nil).
func (s *subjects) has(policyID, bookingID *int64) bool {
	return s == nil || (policyID != nil && s.policies[*policyID]) || (bookingID != nil && s.bookings[*bookingID])
}

// late keeps the late arrivals a customer may see: their own calls', among
// the newest the fake lists, and counts only those (an admin's: all).
func (s *subjects) late(l fault.LateArrivals) fault.LateArrivals {
	if s == nil {
		return l
	}
	var own fault.LateArrivals
	for _, a := range l.Recent {
		if s.has(a.PolicyID, a.BookingID) {
			own.Recent = append(own.Recent, a)
		}
	}
	own.Total = int64(len(own.Recent))
	return own
}

// maxOwnSubjects bounds the lookup: a demo customer has a handful.
const maxOwnSubjects = 1000

// handleProviderPage: GET /provider — the fault configuration, the effects
// ledger and, per mode, what the caller sees against what really happened.
// Everyone signed in may look; only the admin gets working buttons.
func (app *App) handleProviderPage(c echo.Context) error {
	ctx := c.Request().Context()
	s := app.providerAdmin()
	cfg, err := app.providerControl.Faults(ctx)
	if err != nil {
		return s.controlError(c, err)
	}
	effects, err := app.providerControl.Effects(ctx)
	if err != nil {
		return s.controlError(c, err)
	}
	own, err := app.ownSubjects(c)
	if err != nil {
		return err
	}
	var late fault.LateArrivals
	if effects.Late != nil {
		late = *effects.Late
	}
	fv, err := app.faultsView(c, "provider", cfg, app.cfg.ProviderTimeout.String(), own.late(late))
	if err != nil {
		return err
	}
	vm := views.ProviderView{
		FakeView: fv,
		Effects:  views.ProviderEffects{Total: effects.Total, Pending: effects.Pending},
	}
	if own != nil {
		// A customer's ledger is their own policies' lines, and its totals
		// theirs: the whole ledger is the admin's, as in the API.
		vm.Effects = views.ProviderEffects{Own: true}
	}
	if vm.Callbacks, err = app.callbacksView(c, s); err != nil {
		return err
	}
	for _, pe := range effects.ByPolicy {
		if own != nil && !own.policies[pe.PolicyID] {
			continue
		}
		vm.Effects.ByPolicy = append(vm.Effects.ByPolicy, views.PolicyEffect{PolicyID: pe.PolicyID, Count: pe.Count, Pending: pe.Pending})
		if own != nil {
			vm.Effects.Total += pe.Count
			vm.Effects.Pending += pe.Pending
		}
	}
	return render(c, http.StatusOK, views.ProviderPage(app.page(c, "Provider", "provider"), vm))
}
