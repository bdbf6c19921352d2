package workflow

import (
	"strings"
	"testing"
)

// The timeline names sqlInsertSteps for the COPY that insertSteps sends:
// the two spell the same columns.
func TestInsertStepsNamesTheCopyItSends(t *testing.T) {
	if cols := "(" + strings.Join(insertStepsColumns, ", ") + ")"; !strings.Contains(sqlInsertSteps, "COPY operation_steps "+cols+" FROM STDIN") {
		t.Errorf("sqlInsertSteps is %q; insertSteps copies %s", sqlInsertSteps, cols)
	}
}
