package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/views"
)

// The payments service's own part of its control surface (the shared part is
// handlers_fakes.go): its ledger and its page.

// handleGetPaymentsLedger: GET /api/v1/payments/ledger (admin) — every money
// movement the fake payments service carried out: {"charges", "refunds",
// "by_subject", "entries", "late"} (docs/payments.md). A policy's "refunds"
// above 1 is a double refund.
func (app *App) handleGetPaymentsLedger(c echo.Context) error {
	l, err := app.paymentsControl.Ledger(c.Request().Context())
	if err != nil {
		return app.paymentsAdmin().controlError(c, err)
	}
	return c.JSON(http.StatusOK, l)
}

// handlePaymentsPage: GET /payments — the payments service's faults, its
// ledger and what each mode means for a refund. Everyone signed in may look;
// only the admin gets working buttons.
func (app *App) handlePaymentsPage(c echo.Context) error {
	ctx := c.Request().Context()
	s := app.paymentsAdmin()
	cfg, err := app.paymentsControl.Faults(ctx)
	if err != nil {
		return s.controlError(c, err)
	}
	l, err := app.paymentsControl.Ledger(ctx)
	if err != nil {
		return s.controlError(c, err)
	}
	own, err := app.ownSubjects(c)
	if err != nil {
		return err
	}
	fv, err := app.faultsView(c, "payments", cfg, app.cfg.PaymentsTimeout.String(), own.late(l.Late))
	if err != nil {
		return err
	}
	vm := views.PaymentsView{
		FakeView: fv,
		Charges:  views.MoneyTotals{Count: l.Charges.Count, Pending: l.Charges.Pending, Cents: l.Charges.AmountCents},
		Refunds:  views.MoneyTotals{Count: l.Refunds.Count, Pending: l.Refunds.Pending, Cents: l.Refunds.AmountCents},
	}
	if own != nil {
		// A customer's ledger is their own policies' and bookings' lines,
		// totals included: the whole ledger is the admin's, as in the API.
		vm.Own = true
		vm.Charges, vm.Refunds = views.MoneyTotals{}, views.MoneyTotals{}
	}
	if vm.Callbacks, err = app.callbacksView(c, s); err != nil {
		return err
	}
	for _, sl := range l.BySubject {
		if !own.has(sl.PolicyID, sl.BookingID) {
			continue
		}
		if own != nil {
			vm.Charges.Count += sl.Charges
			vm.Refunds.Count += sl.Refunds
			vm.Charges.Cents += sl.ChargedCents
			vm.Refunds.Cents += sl.RefundedCents
		}
		vm.BySubject = append(vm.BySubject, views.MoneyLine{PolicyID: sl.PolicyID, BookingID: sl.BookingID,
			Charges: sl.Charges, Refunds: sl.Refunds, Pending: sl.Pending, ChargedCents: sl.ChargedCents, RefundedCents: sl.RefundedCents})
	}
	for _, e := range l.Entries {
		if len(vm.Entries) == 10 {
			break
		}
		if !own.has(e.PolicyID, e.BookingID) {
			continue
		}
		vm.Entries = append(vm.Entries, views.MoneyEntry{Kind: e.Kind, Key: e.Key, PolicyID: e.PolicyID, BookingID: e.BookingID,
			ChargeKey: e.ChargeKey, Cents: e.AmountCents, Pending: e.Pending})
	}
	return render(c, http.StatusOK, views.PaymentsPage(app.page(c, "Payments", "payments"), vm))
}
