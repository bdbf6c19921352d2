package views

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/a-h/templ"
)

// rendered is c's HTML.
func rendered(t *testing.T, c templ.Component) string {
	t.Helper()
	var b bytes.Buffer
	if err := c.Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The home page promises "one card each": every page in the bar, and the
// desk, has its card (issue 29, the third reader's finding 12).
func TestHomeHasACardForEveryPageInTheBar(t *testing.T) {
	home := rendered(t, homeContent(Page{}))
	for _, item := range append(Nav, NavItem{"reconciliation", "Reconciliation", "/reconciliation"}) {
		if !strings.Contains(home, `<header><a href="`+item.Href+`">`) {
			t.Errorf("the home page has no card for %s (%s)", item.Label, item.Href)
		}
	}
}

// A customer's /operations says what a customer sees — their own, no user
// filter — and the admin's what an admin sees (finding 10).
func TestOperationsListIntroFollowsTheRole(t *testing.T) {
	customer := rendered(t, operationsContent(OperationsView{}))
	for _, wrong := range []string{"every operation", "kind, user", `name="user"`} {
		if strings.Contains(customer, wrong) {
			t.Errorf("a customer's /operations says %q", wrong)
		}
	}
	admin := rendered(t, operationsContent(OperationsView{Admin: true}))
	for _, must := range []string{"every operation", "kind, user", `name="user"`} {
		if !strings.Contains(admin, must) {
			t.Errorf("the admin's /operations lacks %q", must)
		}
	}
}

// An injection armed for every consumer says so, in the form's words, not
// "consumer —" (finding 13).
func TestAnInjectionForEveryConsumerSaysSo(t *testing.T) {
	every := rendered(t, injectionLine(InjectionRow{Mode: "fail_after_commit", Remaining: 1}))
	if !strings.Contains(every, "every consumer") || strings.Contains(every, "—") {
		t.Errorf("an injection for every consumer reads %q", every)
	}
	one := rendered(t, injectionLine(InjectionRow{Mode: "lose_ack", Consumer: "ledger", Remaining: 2}))
	if !strings.Contains(one, "consumer ledger") {
		t.Errorf("an injection for one consumer reads %q", one)
	}
}

// The crash idea names the crashed operation's owner as Recovery shows it,
// "owned" by a request (handlers_recovery.go), one that is gone — not a
// lease "held by nobody alive" (finding 11).
func TestTheCrashIdeaSaysWhatRecoveryShows(t *testing.T) {
	idea := rendered(t, crashWindowContent(true))
	if strings.Contains(idea, "nobody alive") {
		t.Error("the crash idea says the lease is held by nobody alive; Recovery shows it owned")
	}
	for _, must := range []string{"“owned” by the request that was cut off", "Lease until"} {
		if !strings.Contains(idea, must) {
			t.Errorf("the crash idea lacks %q", must)
		}
	}
}

// A booking without a deposit promises no refund and no second operation
// (fourth read: a plain booking's button and Try this said "the deposit is
// refunded first … read the second operation").
func TestAPlainBookingPromisesNoDeposit(t *testing.T) {
	plain := rendered(t, bookingContent(Page{}, BookingView{ID: 1, SlotName: "Consulting room 2", Status: "CONFIRMED", CancelKey: "k"}))
	if strings.Contains(plain, "deposit is refunded") || strings.Contains(plain, "second operation") {
		t.Errorf("a booking without a deposit speaks of its deposit's refund")
	}
	paid := rendered(t, bookingContent(Page{}, BookingView{ID: 2, SlotName: "Recording studio", Status: "CONFIRMED", Deposit: "25.00", CancelKey: "k"}))
	if !strings.Contains(paid, "the deposit is refunded first") {
		t.Errorf("a booking with a deposit no longer says it is refunded first")
	}
}
