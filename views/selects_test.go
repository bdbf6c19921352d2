package views

import (
	"bytes"
	"io/fs"
	"regexp"
	"strings"
	"testing"
)

// A closed select shows one line cut to its width: the fake pages' selects
// carry a mode's name only, and what it does is told beside them (issue 29,
// second read, finding 4: "off — no callbacks: the" and "lost_respon").
func TestFakeSelectsShowOnlyModesAndTellWhatEachDoes(t *testing.T) {
	var out bytes.Buffer
	if err := Callbacks(Page{}, CallbacksView{System: "provider", CanEdit: true, Mode: "off"}).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	html := out.String()
	options := regexp.MustCompile(`<option[^>]*>([^<]*)</option>`).FindAllStringSubmatch(html, -1)
	if len(options) != len(webhookModes) {
		t.Fatalf("%d options, want one per mode (%d)", len(options), len(webhookModes))
	}
	for _, o := range options {
		if len(o[1]) > len("lost_response") {
			t.Errorf("an option reads %q: longer than a mode's name, a closed select cuts it", o[1])
		}
	}
	for _, m := range webhookModes {
		if !strings.Contains(html, m.Says) {
			t.Errorf("the page does not say what %s does (%q)", m.Mode, m.Says)
		}
	}
	// The script's Mode select is at least as wide as its longest mode.
	css, err := fs.ReadFile(Static, "app.css")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\.script-fields select \{ min-width: [0-9.]+rem; \}`).Match(css) {
		t.Error("app.css gives the script's Mode select no min-width: lost_response is cut")
	}
	if strings.Contains(string(css), `fieldset[role="group"] select { min-width: 0; }`) {
		t.Error("app.css lets the overrides' mode select shrink to nothing on a phone: lost_response is cut")
	}
}
