package workflow

// A timeline line names the statement that made its transition — the Go
// constant that holds it, "workflow.sqlStepSent", written where the
// transition is recorded — and never keeps a copy of its text or its
// values: the text lives once, in the code. The operation page shows the
// text (Statement) and links the name to the line that declares it in the
// embedded source; the engine knows nothing of either. This file builds on
// the files that hold the statements; none of them refers to it.

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

// Statement returns the text of the statement a timeline line names.
func Statement(name string) (sql string, ok bool) {
	sql, ok = statements[name]
	return sql, ok
}
