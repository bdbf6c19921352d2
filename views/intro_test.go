package views

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/a-h/templ"
)

// Every page opens with what the reader is looking at and what to try
// there (the README's promise); the policy page and the booking page did
// not (issue 29's second read). The pages a browser test cannot reach
// cheaply are rendered here.
func TestPolicyAndBookingPagesOpenWithAnIntro(t *testing.T) {
	for name, c := range map[string]templ.Component{
		"policy":  policyContent(Page{}, PolicyDetail{ID: 1, Number: "POL-ALICE-001", Status: "ACTIVE", CanCancel: true}),
		"booking": bookingContent(Page{}, BookingView{ID: 1, Status: "CONFIRMED"}),
	} {
		var b bytes.Buffer
		if err := c.Render(context.Background(), &b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if html := b.String(); strings.Count(html, `data-testid="page-intro"`) != 1 ||
			!strings.Contains(html, "What you are looking at:") || !strings.Contains(html, "Try this:") {
			t.Errorf("the %s page has no intro", name)
		}
	}
}

// The double-click lab mints the keys it sends; it does not claim to
// submit "this page's cancel form", whose key the page shows (issue 29's
// second read: the lab's keys were not the form's).
func TestDoubleClickLabSaysWhoseKeysItSends(t *testing.T) {
	var b bytes.Buffer
	if err := DoubleClickLab(1, "csrf").Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	if strings.Contains(html, "of this page's cancel form") || !strings.Contains(html, "The lab mints the keys it sends") {
		t.Errorf("the lab's panel says it submits this page's form, or not whose keys it sends:\n%s", html)
	}
}
