package views

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idemlab/idemlab/internal/workflow"
)

// TestALiveOperationNamesItsSubject: the recovery page's live list names a
// deposit saga's booking — it had shown such an operation as "policy 0".
func TestALiveOperationNamesItsSubject(t *testing.T) {
	v := RecoveryView{Live: []LiveOperation{
		{ID: 1, Subject: workflow.Operation{PolicyID: 3}.Subject(), Status: "IN_PROGRESS"},
		{ID: 2, Subject: workflow.Operation{BookingID: 7}.Subject(), Status: "RECOVERING"},
	}}
	var out bytes.Buffer
	if err := RecoveryPanel(v).Render(t.Context(), &out); err != nil {
		t.Fatal(err)
	}
	html := out.String()
	for _, want := range []string{"policy 3", "booking 7"} {
		if !strings.Contains(html, want) {
			t.Errorf("the live list does not say %q", want)
		}
	}
	if strings.Contains(html, "policy 0") {
		t.Error(`the live list says "policy 0"`)
	}
}
