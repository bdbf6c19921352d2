package web

import (
	"strings"
	"testing"
)

// Recovery's poll lines quote the status query's error in parentheses, and
// a 503's error ends in its JSON body and a line break: a customer reads
// the words around it, none of the quote (issue 29, the third reader's
// finding 5: "(HTTP 503)" on bob's timeline). Actors lose their instance.
func TestCustomerTextDropsAMultiLineQuotedError(t *testing.T) {
	raw := "poll 1/5: provider could not be asked (provider: status 1:provider_cancel: external: unreachable: " +
		"unexpected HTTP status 503: {\"error\":\"unavailable\",\"message\":\"the system is temporarily unavailable\"}\n" +
		"); lease renewed, asking again in 500ms"
	got := customerText(raw)
	if want := "poll 1/5: provider could not be asked; lease renewed, asking again in 500ms"; got != want {
		t.Errorf("customerText:\n got %q\nwant %q", got, want)
	}
	if got := customerText("could not be asked (a (nested) cause) and its deadline had passed (x)."); got != "could not be asked and its deadline had passed." {
		t.Errorf("nested: %q", got)
	}
	for actor, want := range map[string]string{"recovery on vm": "recovery", "request 7f3a on app-2": "request 7f3a", "admin (desk)": "admin (desk)"} {
		if got := customerActor(actor); got != want || strings.Contains(got, " on ") {
			t.Errorf("customerActor(%q) = %q, want %q", actor, got, want)
		}
	}
}
