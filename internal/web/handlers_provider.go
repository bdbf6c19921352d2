package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/fault"
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
	var late fault.LateArrivals
	if effects.Late != nil {
		late = *effects.Late
	}
	fv, err := app.faultsView(c, "provider", cfg, app.cfg.ProviderTimeout.String(), late)
	if err != nil {
		return err
	}
	vm := views.ProviderView{
		FakeView: fv,
		Effects:  views.ProviderEffects{Total: effects.Total, Pending: effects.Pending},
	}
	for _, pe := range effects.ByPolicy {
		vm.Effects.ByPolicy = append(vm.Effects.ByPolicy, views.PolicyEffect{PolicyID: pe.PolicyID, Count: pe.Count, Pending: pe.Pending})
	}
	return render(c, http.StatusOK, views.ProviderPage(app.page(c, "Provider", "provider"), vm))
}
