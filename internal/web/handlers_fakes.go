package web

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/recovery"
	"github.com/idemlab/idemlab/views"
)

// The control surface of the fake external systems — the provider and
// payments — is one set of handlers with the system plugged in: admin
// endpoints and page forms that set a fake's faults and reset it, going
// through the fake's own HTTP control API, so they work the same whether the
// fake runs in this process or elsewhere (PROVIDER_URL, PAYMENTS_URL). Each
// system adds its own ledger endpoint and page (handlers_provider.go,
// handlers_payments.go).
//
// None of them takes an Idempotency-Key: they configure a test double, they
// are not business mutations. PUT replaces a whole setting (sending it twice
// leaves the same configuration) and reset ends in the same state however
// often it runs. The one exception is a PUT with "next" > 0, which appends a
// script entry each time it is sent: a script is a queue by design.

// faultControl is what the handlers need of a fake's control client;
// provider/fake.Control and payments/fake.Control both are one.
type faultControl interface {
	Faults(ctx context.Context) (fault.Config, error)
	SetFaults(ctx context.Context, f fault.Fault) (fault.Config, error)
	Reset(ctx context.Context) error
	Webhooks(ctx context.Context) (fault.WebhookLedger, error)
	SetWebhookSettings(ctx context.Context, w fault.WebhookSettings) (fault.WebhookSettings, error)
}

// fakeAdmin is one fake system's control surface.
type fakeAdmin struct {
	name    string // "provider", "payments": paths and logs
	page    string // "/provider", "/payments": where the forms return
	control faultControl
	// unreachable is what an admin sees when the control API does not
	// answer; the cause (which may name hosts) goes to the log only.
	unreachable error
	// subjects are the form fields a fault may be scoped by.
	subjects []string
	// believe records what the app believes about the system's
	// idempotency (external_systems): the page's switch flips the fake and
	// the belief together.
	believe func(ctx context.Context, idempotent bool, by string) error
}

var (
	errProviderUnreachable = errors.New("the fake provider's control API did not answer; the log has the cause under this request's id")
	errPaymentsUnreachable = errors.New("the fake payments service's control API did not answer; the log has the cause under this request's id")
)

func (app *App) providerAdmin() fakeAdmin {
	return fakeAdmin{name: "provider", page: "/provider", control: app.providerControl,
		unreachable: errProviderUnreachable, subjects: []string{"policy_id"}, believe: app.believer("provider")}
}

func (app *App) paymentsAdmin() fakeAdmin {
	return fakeAdmin{name: "payments", page: "/payments", control: app.paymentsControl,
		unreachable: errPaymentsUnreachable, subjects: []string{"policy_id", "booking_id"}, believe: app.believer("payments")}
}

// believer sets what the app believes about system.
func (app *App) believer(system string) func(ctx context.Context, idempotent bool, by string) error {
	return func(ctx context.Context, idempotent bool, by string) error {
		_, err := recovery.SetBelief(ctx, app.pool, system, idempotent, by)
		return err
	}
}

// controlError keeps a refused fault (*fault.InvalidError: 422
// invalid-fault naming the field, errors.go) and a call cut short because
// the client left (handleError logs it as such, not as the fake's failure),
// and turns every other control failure into the system's unreachable
// error (502).
func (s fakeAdmin) controlError(c echo.Context, err error) error {
	var invalid *fault.InvalidError
	if errors.As(err, &invalid) {
		return invalidFault(invalid)
	}
	if clientLeft(c, err) {
		return err
	}
	logFrom(c.Request().Context()).Warn(s.name+" control", "err", err)
	return s.unreachable
}

// getFaults: GET /api/v1/{system}/faults (admin) — the whole fault
// configuration: {"global": {…}, "overrides": […], "script": […]}.
func (s fakeAdmin) getFaults(c echo.Context) error {
	cfg, err := s.control.Faults(c.Request().Context())
	if err != nil {
		return s.controlError(c, err)
	}
	return c.JSON(http.StatusOK, cfg)
}

// putFaults: PUT /api/v1/{system}/faults (admin) — one fault setting
// (fields left out take fault.Default's values), answered with the whole new
// configuration. application/json only (415); unknown fields, trailing data
// or an empty body are 400 invalid-json; a value out of range is 422
// invalid-fault with the field.
func (s fakeAdmin) putFaults(c echo.Context) error {
	var f fault.Fault // decodes itself over fault.Default, strictly, naming a number too large to hold
	if err := decodeJSON(c, &f); err != nil {
		return err
	}
	if err := s.validate(f); err != nil {
		return err
	}
	cfg, err := s.control.SetFaults(c.Request().Context(), f)
	if err != nil {
		return s.controlError(c, err)
	}
	return c.JSON(http.StatusOK, cfg)
}

// validate refuses, here, a fault the fake would refuse: 422 invalid-fault
// naming the field, whatever the fake's own limits on what it reads.
func (s fakeAdmin) validate(f fault.Fault) error {
	kinds := make([]string, len(s.subjects))
	for i, field := range s.subjects {
		kinds[i] = strings.TrimSuffix(field, "_id")
	}
	var invalid *fault.InvalidError
	if err := f.Validate(s.name, kinds...); errors.As(err, &invalid) {
		return invalidFault(invalid)
	} else if err != nil {
		return err
	}
	return nil
}

// reset: POST /api/v1/{system}/reset (admin) — 204: the fake forgets every
// request and effect, empties the script, drops the overrides and restores
// the default fault.
func (s fakeAdmin) reset(c echo.Context) error {
	if err := s.control.Reset(c.Request().Context()); err != nil {
		return s.controlError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// faultsForm: POST /{system}/faults (admin) — the page's forms. A form sends
// only the fields it changes (mode, idempotent, slow_ms, latency_ms,
// status_mode, a subject, next); the rest are the current global fault's, so
// "queue lost_response for the next call" keeps the fake as idempotent as it
// is now. Then POST/redirect/GET back to the page.
func (s fakeAdmin) faultsForm(c echo.Context) error {
	ctx := c.Request().Context()
	cfg, err := s.control.Faults(ctx)
	if err != nil {
		return s.controlError(c, err)
	}
	f, err := s.faultFromForm(c, cfg.Global)
	if err != nil {
		return err
	}
	if err := s.validate(f); err != nil {
		return err
	}
	// The switch flips the fake and what the app believes about it together
	// (a deliberate mismatch is a lab's, labelled as such), in the order that
	// never lets the app believe "idempotent" of a fake that is not: to not
	// idempotent, the belief first; to idempotent, the fake first.
	flip := c.FormValue("idempotent") != "" && f.PolicyID == nil && f.BookingID == nil && f.Next == 0
	u, _ := userFrom(c)
	by := u.Name + " (the " + s.name + " page's switch)"
	if flip && !f.Idempotent {
		if err := s.believe(ctx, false, by); err != nil {
			return err
		}
	}
	if _, err := s.control.SetFaults(ctx, f); err != nil {
		return s.controlError(c, err)
	}
	if flip && f.Idempotent {
		if err := s.believe(ctx, true, by); err != nil {
			return err
		}
	}
	return c.Redirect(http.StatusSeeOther, s.page)
}

// resetForm: POST /{system}/reset (admin), then back to the page.
func (s fakeAdmin) resetForm(c echo.Context) error {
	if err := s.control.Reset(c.Request().Context()); err != nil {
		return s.controlError(c, err)
	}
	return c.Redirect(http.StatusSeeOther, s.page)
}

// faultFromForm lays the form's fields over base. A scoped setting (an
// override or a script entry) drops base's status_mode, which only the
// global fault may carry. A field that is not a number is 400; a number too
// large to hold is 422 naming the field, like any value out of range.
func (s fakeAdmin) faultFromForm(c echo.Context, base fault.Fault) (fault.Fault, error) {
	f := base
	f.PolicyID, f.BookingID, f.Next = nil, nil, 0
	if v := c.FormValue("mode"); v != "" {
		f.Mode = fault.Mode(v)
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
		f.StatusMode = fault.StatusMode(v)
	}
	number := func(name string) (int64, bool, error) {
		v := strings.TrimSpace(c.FormValue(name))
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return 0, false, invalidFault(&fault.InvalidError{Field: name, Message: name + " is out of range"})
		}
		if err != nil {
			return 0, false, invalidFormFault(name + " must be a whole number")
		}
		return n, true, nil
	}
	for _, field := range []struct {
		name string
		dst  *int
	}{{"slow_ms", &f.SlowMS}, {"latency_ms", &f.LatencyMS}, {"next", &f.Next}} {
		n, ok, err := number(field.name)
		if err != nil {
			return f, err
		}
		if ok {
			*field.dst = int(n)
		}
	}
	for _, name := range s.subjects {
		n, ok, err := number(name)
		if err != nil {
			return f, err
		}
		if !ok {
			continue
		}
		if name == "policy_id" {
			f.PolicyID = &n
		} else {
			f.BookingID = &n
		}
	}
	scoped := f.PolicyID != nil || f.BookingID != nil
	if c.FormValue("scoped") == "true" && !scoped {
		return f, invalidFormFault("an override needs a " + strings.Join(s.subjects, " or a "))
	}
	if scoped || f.Next > 0 {
		f.StatusMode = ""
	}
	return f, nil
}

// invalidFault is a fault setting a fake refused: 422 invalid-fault naming
// the field.
func invalidFault(e *fault.InvalidError) *refusal {
	return refuse(fault.ErrInvalidFault, "Invalid fault", e.Message).With("field", e.Field)
}

func invalidFormFault(detail string) *refusal {
	return refuse(errFaultUnreadable, "Invalid fault", detail)
}

// faultView is one fault setting as the pages show it.
func faultView(f fault.Fault) views.FaultView {
	return views.FaultView{
		Mode: string(f.Mode), Idempotent: f.Idempotent, SlowMS: f.SlowMS, LatencyMS: f.LatencyMS,
		StatusMode: string(f.StatusMode), PolicyID: f.PolicyID, BookingID: f.BookingID, Next: f.Next,
	}
}

// faultsView fills the part of a fake's page every fake shares, with what
// the app believes about the system's idempotency.
func (app *App) faultsView(c echo.Context, system string, cfg fault.Config, timeout string, late fault.LateArrivals) (views.FakeView, error) {
	u, _ := userFrom(c)
	v := views.FakeView{System: system, CanEdit: u.IsAdmin(), Timeout: timeout, Global: faultView(cfg.Global),
		LateTotal: late.Total, LateOwn: !u.IsAdmin()}
	for _, f := range cfg.Overrides {
		v.Overrides = append(v.Overrides, faultView(f))
	}
	for _, f := range cfg.Script {
		v.Script = append(v.Script, faultView(f))
	}
	for i, l := range late.Recent {
		if i == 5 {
			break
		}
		v.Late = append(v.Late, l.Message)
	}
	beliefs, err := recovery.Beliefs(c.Request().Context(), app.pool)
	if err != nil {
		return v, err
	}
	for _, b := range beliefs {
		if b.System == system {
			v.Belief = &views.Belief{System: b.System, Idempotent: b.Idempotent,
				By: b.UpdatedBy + " at " + b.UpdatedAt.UTC().Format("15:04:05 MST")}
		}
	}
	return v, nil
}
