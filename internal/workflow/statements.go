package workflow

// A timeline line names the statement that made its transition — the Go
// constant that holds it, "workflow.sqlStepSent" — and never keeps a copy
// of its text or its values: the text lives once, here in the code. The
// operation page shows the text (Statement) and links the name to the
// line that declares it in the embedded source; the engine knows nothing
// of either.

// statements are the engine's transitions' statements, by name.
var statements = map[string]string{
	"workflow.sqlInsertSteps":      sqlInsertSteps,
	"workflow.sqlStepsDone":        sqlStepsDone,
	"workflow.sqlStepSkipped":      sqlStepSkipped,
	"workflow.sqlStepSent":         sqlStepSent,
	"workflow.sqlStepAnswered":     sqlStepAnswered,
	"workflow.sqlSucceed":          sqlSucceed,
	"workflow.sqlFail":             sqlFail,
	"workflow.sqlHandOver":         sqlHandOver,
	"workflow.sqlReconcile":        sqlReconcile,
	"workflow.sqlRenewLease":       sqlRenewLease,
	"workflow.sqlBackOff":          sqlBackOff,
	"workflow.sqlTakeBack":         sqlTakeBack,
	"workflow.sqlClaimSkipLocked":  sqlClaimSkipLocked,
	"workflow.sqlClaimTransition":  sqlClaimTransition,
	"workflow.sqlDecide":           sqlDecide,
	"workflow.sqlRetryRequested":   sqlRetryRequested,
	"workflow.sqlCallbackTakeOver": sqlCallbackTakeOver,
	"workflow.sqlRequestCancel":    sqlRequestCancel,
	"workflow.sqlStepsCancelled":   sqlStepsCancelled,
	"workflow.sqlCancelSetAside":   sqlCancelSetAside,
	"workflow.sqlRetryFrom":        sqlRetryFrom,
	"workflow.sqlCarrySteps":       sqlCarrySteps,
}

// statementNames is statements the other way round: the runner records a
// transition by the statement it ran, the timeline by its name.
var statementNames = func() map[string]string {
	names := make(map[string]string, len(statements))
	for name, sql := range statements {
		names[sql] = name
	}
	return names
}()

// Statement returns the text of the statement a timeline line names.
func Statement(name string) (sql string, ok bool) {
	sql, ok = statements[name]
	return sql, ok
}

// nameOf is the name of sql ("" for a statement the timeline does not name).
func nameOf(sql string) string { return statementNames[sql] }
