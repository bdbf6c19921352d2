package readmodel

import (
	"strings"
	"testing"
)

// A timeline line names its statement, and the page folds its SQL under
// it; a line written outside the engine (the demo's "let its lease run
// out now") stores the SQL itself, and it is folded the same way, with no
// name — never printed after "written by" (issue 29's second read).
func TestATimelineLineNamesItsStatementOrFoldsIt(t *testing.T) {
	named := Event{StatementName: "workflow.sqlStepSent"}
	statementOf(&named)
	if named.StatementName != "workflow.sqlStepSent" || !strings.Contains(named.Statement, "UPDATE") {
		t.Errorf("a named statement: %q / %q", named.StatementName, named.Statement)
	}
	raw := Event{StatementName: "\nUPDATE operations\n   SET lease_expires_at = now()\n WHERE id = $1"}
	statementOf(&raw)
	if raw.StatementName != "" || !strings.HasPrefix(raw.Statement, "UPDATE operations") {
		t.Errorf("SQL stored as the name: name %q, statement %q", raw.StatementName, raw.Statement)
	}
}
