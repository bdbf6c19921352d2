package web

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/provider/fake"
	"github.com/idemlab/idemlab/views"
)

// The provider control surface: admin endpoints and a page that set the fake
// provider's faults and read its effects ledger. They go through
// app.providerControl, the fake's own HTTP control API, so they work the same
// whether the provider runs in this process or elsewhere (PROVIDER_URL).
//
// None of them takes an Idempotency-Key: they configure a test double, they
// are not business mutations. PUT replaces a whole setting (sending it twice
// leaves the same configuration) and reset ends in the same state however
// often it runs. The one exception is a PUT with "next" > 0, which appends a
// script entry each time it is sent: a script is a queue by design.

// errProviderUnreachable is what an admin sees when the fake's control API
// does not answer; the cause (which may name hosts) goes to the log only.
var errProviderUnreachable = errors.New("the fake provider's control API did not answer; the log has the cause under this request's id")

// controlError keeps fake.ErrInvalidFault (400 invalid-fault, errors.go) and
// turns every other control failure into errProviderUnreachable (502).
func controlError(c echo.Context, err error) error {
	var invalid *fault.InvalidError
	if errors.As(err, &invalid) {
		return invalidFault(invalid)
	}
	if errors.Is(err, fake.ErrInvalidFault) {
		return err
	}
	logFrom(c.Request().Context()).Warn("provider control", "err", err)
	return errProviderUnreachable
}

// handleGetProviderFaults: GET /api/v1/provider/faults (admin) — the whole
// fault configuration: {"global": {…}, "overrides": […], "script": […]}.
func (app *App) handleGetProviderFaults(c echo.Context) error {
	cfg, err := app.providerControl.Faults(c.Request().Context())
	if err != nil {
		return controlError(c, err)
	}
	return c.JSON(http.StatusOK, cfg)
}

// handlePutProviderFaults: PUT /api/v1/provider/faults (admin) — one fault
// setting (fields left out take fake.DefaultFault's values), answered with
// the whole new configuration.
func (app *App) handlePutProviderFaults(c echo.Context) error {
	var f fake.Fault // its UnmarshalJSON starts from fake.DefaultFault and refuses unknown fields
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	cfg, err := app.providerControl.SetFaults(c.Request().Context(), f)
	if err != nil {
		return controlError(c, err)
	}
	return c.JSON(http.StatusOK, cfg)
}

// handleGetProviderEffects: GET /api/v1/provider/effects (admin) — the
// effects ledger: {"total", "pending", "by_policy": [{"policy_id", "count",
// "pending"}]}. A count above 1 is a double cancellation.
func (app *App) handleGetProviderEffects(c echo.Context) error {
	e, err := app.providerControl.Effects(c.Request().Context())
	if err != nil {
		return controlError(c, err)
	}
	return c.JSON(http.StatusOK, e)
}

// handleResetProvider: POST /api/v1/provider/reset (admin) — 204: the fake
// forgets every request and effect, empties the script, drops the overrides
// and restores the default fault.
func (app *App) handleResetProvider(c echo.Context) error {
	if err := app.providerControl.Reset(c.Request().Context()); err != nil {
		return controlError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// handleProviderPage: GET /provider — the fault configuration, the effects
// ledger and, per mode, what the caller sees against what really happened.
// Everyone signed in may look; only the admin gets working buttons.
func (app *App) handleProviderPage(c echo.Context) error {
	ctx := c.Request().Context()
	cfg, err := app.providerControl.Faults(ctx)
	if err != nil {
		return controlError(c, err)
	}
	effects, err := app.providerControl.Effects(ctx)
	if err != nil {
		return controlError(c, err)
	}
	u, _ := userFrom(c)
	vm := views.ProviderView{
		CanEdit: u.IsAdmin(),
		Timeout: app.cfg.ProviderTimeout.String(),
		Global:  faultView(cfg.Global),
		Effects: views.ProviderEffects{Total: effects.Total, Pending: effects.Pending},
	}
	for _, f := range cfg.Overrides {
		vm.Overrides = append(vm.Overrides, faultView(f))
	}
	for _, f := range cfg.Script {
		vm.Script = append(vm.Script, faultView(f))
	}
	for _, pe := range effects.ByPolicy {
		vm.Effects.ByPolicy = append(vm.Effects.ByPolicy, views.PolicyEffect{PolicyID: pe.PolicyID, Count: pe.Count, Pending: pe.Pending})
	}
	return render(c, http.StatusOK, views.ProviderPage(app.page(c, "Provider", "provider"), vm))
}

func faultView(f fake.Fault) views.ProviderFault {
	return views.ProviderFault{
		Mode: string(f.Mode), Idempotent: f.Idempotent, SlowMS: f.SlowMS, LatencyMS: f.LatencyMS,
		StatusMode: string(f.StatusMode), PolicyID: f.PolicyID, Next: f.Next,
	}
}

// handleProviderFaultsForm: POST /provider/faults (admin) — the page's forms.
// A form sends only the fields it changes (mode, idempotent, slow_ms,
// latency_ms, status_mode, policy_id, next); the rest are the current global
// fault's, so "queue lost_response for the next call" keeps the provider as
// idempotent as it is now. Then POST/redirect/GET back to the page.
func (app *App) handleProviderFaultsForm(c echo.Context) error {
	ctx := c.Request().Context()
	cfg, err := app.providerControl.Faults(ctx)
	if err != nil {
		return controlError(c, err)
	}
	f, err := faultFromForm(c, cfg.Global)
	if err != nil {
		return err
	}
	if _, err := app.providerControl.SetFaults(ctx, f); err != nil {
		return controlError(c, err)
	}
	return c.Redirect(http.StatusSeeOther, "/provider")
}

// faultFromForm lays the form's fields over base. A scoped setting (an
// override or a script entry) drops base's status_mode, which only the
// global fault may carry.
func faultFromForm(c echo.Context, base fake.Fault) (fake.Fault, error) {
	f := base
	f.PolicyID, f.Next = nil, 0
	if v := c.FormValue("mode"); v != "" {
		f.Mode = fake.Mode(v)
	}
	switch c.FormValue("idempotent") {
	case "":
	case "true":
		f.Idempotent = true
	case "false":
		f.Idempotent = false
	default:
		return f, invalidFormFault("idempotent must be true or false")
	}
	if v := c.FormValue("status_mode"); v != "" {
		f.StatusMode = fake.StatusMode(v)
	}
	for _, field := range []struct {
		name string
		dst  *int
	}{{"slow_ms", &f.SlowMS}, {"latency_ms", &f.LatencyMS}, {"next", &f.Next}} {
		v := strings.TrimSpace(c.FormValue(field.name))
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return f, invalidFormFault(field.name + " must be a whole number")
		}
		*field.dst = n
	}
	if v := strings.TrimSpace(c.FormValue("policy_id")); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return f, invalidFormFault("policy_id must be a policy's id")
		}
		f.PolicyID = &id
	}
	if f.PolicyID != nil || f.Next > 0 {
		f.StatusMode = ""
	}
	return f, nil
}

// invalidFault is a fault setting the fake refused: 422 invalid-fault
// naming the field.
func invalidFault(e *fault.InvalidError) *problem.Problem {
	return problem.New(http.StatusUnprocessableEntity, "invalid-fault", "Invalid fault", e.Message).With("field", e.Field)
}

func invalidFormFault(detail string) *problem.Problem {
	return problem.New(http.StatusBadRequest, "invalid-fault", "Invalid fault", detail)
}

// handleProviderResetForm: POST /provider/reset (admin), then back to the page.
func (app *App) handleProviderResetForm(c echo.Context) error {
	if err := app.providerControl.Reset(c.Request().Context()); err != nil {
		return controlError(c, err)
	}
	return c.Redirect(http.StatusSeeOther, "/provider")
}
