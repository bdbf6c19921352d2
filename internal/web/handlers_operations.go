package web

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab"
	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/external"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/invariants"
	"github.com/idemlab/idemlab/internal/operations"
	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/tracing"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// operationView is an operation with its steps, its timeline, its log of
// calls, and each system's truth for each external step's key, side by
// side: what we know locally and what really happened elsewhere.
type operationView struct {
	workflow.Operation
	Timeline []readmodel.Event      `json:"timeline"`
	Calls    []readmodel.CallRecord `json:"calls"`
	// Callbacks are the callbacks received about its steps, newest first:
	// how a truth was told rather than asked.
	Callbacks []readmodel.CallbackRecord `json:"callbacks"`
	// Truths is each external step's system asked just now, by step name.
	Truths map[string]truthNow `json:"truths"`
	// Provider is Truths["provider_cancel"], where clients of the first
	// API version look for it.
	Provider truthNow `json:"provider"`
}

type truthNow struct {
	System string `json:"system"`
	Key    string `json:"key"`
	Truth  string `json:"truth,omitempty"` // NOT_STARTED | RUNNING | COMPLETED | REJECTED
	Error  string `json:"error,omitempty"` // why the truth is unknown right now
}

// loadOperation reads what the operation pages and GET /api/v1/operations/{id}
// show. Asking the systems is bounded, and a failure is shown, not fatal.
func (app *App) loadOperation(ctx context.Context, c echo.Context) (operationView, error) {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return operationView{}, err
	}
	op, err := app.engine.GetOperation(ctx, id, u.ID, u.IsAdmin())
	if err != nil {
		return operationView{}, err
	}
	return app.viewOperation(ctx, op, u.IsAdmin())
}

// viewOperation reads what the pages show of op: timeline, calls, each
// system's truth — redacted for anyone but an admin.
func (app *App) viewOperation(ctx context.Context, op workflow.Operation, admin bool) (operationView, error) {
	var err error
	v := operationView{Operation: op, Truths: map[string]truthNow{}}
	if v.Timeline, err = readmodel.Timeline(ctx, app.pool, op.ID); err != nil {
		return operationView{}, err
	}
	if v.Calls, err = readmodel.Calls(ctx, app.pool, op.ID); err != nil {
		return operationView{}, err
	}
	if v.Calls == nil {
		v.Calls = []readmodel.CallRecord{}
	}
	if v.Callbacks, err = readmodel.Callbacks(ctx, app.pool, readmodel.CallbackFilter{OperationID: op.ID}); err != nil {
		return operationView{}, err
	}
	askCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, s := range op.Steps {
		if !s.External() {
			continue
		}
		t := truthNow{System: *s.System, Key: s.Key}
		if truth, err := readmodel.Truth(askCtx, app.engine, op, s.Name); err != nil {
			t.Error = err.Error()
		} else {
			t.Truth = string(truth)
		}
		v.Truths[s.Name] = t
	}
	v.Provider = v.Truths[policies.StepProviderCancel]
	if !admin { // redact.go: a customer reads summaries, not internals
		v.Operation, v.Timeline, v.Calls = customerOperation(v.Operation), customerTimeline(v.Timeline), customerCalls(v.Calls)
		for name, t := range v.Truths {
			if t.Error != "" {
				t.Error = statusFailure(t.System, t.Error)
				v.Truths[name] = t
			}
		}
		v.Provider = v.Truths[policies.StepProviderCancel]
	}
	return v, nil
}

// handleGetOperation: GET /api/v1/operations/:id. With Prefer: wait=N it
// first waits up to N seconds for the operation to become final (wait.go).
func (app *App) handleGetOperation(c echo.Context) error {
	ctx := c.Request().Context()
	v, err := app.loadOperation(ctx, c)
	if err != nil {
		return err // 404 before any wait: nobody waits on what they may not see
	}
	if !v.Terminal() && app.waitFor(c, v.ID) {
		if v, err = app.loadOperation(ctx, c); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, v)
}

// handleOperationPage: GET /operations/:id — the steps, each system's truth,
// the calls and the timeline, refreshing itself until the operation is
// terminal.
func (app *App) handleOperationPage(c echo.Context) error {
	v, err := app.loadOperation(c.Request().Context(), c)
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	vm, err := app.operationDetail(c.Request().Context(), v, u.IsAdmin())
	if err != nil {
		return err
	}
	if u.IsAdmin() && vm.CancelState == "" &&
		(vm.Status == workflow.StatusInProgress || vm.Status == workflow.StatusRecovering) {
		vm.Cancel = &views.ResumeForm{CSRF: csrfToken(c), Key: newFormKey()}
	}
	if u.IsAdmin() && vm.Status == workflow.StatusFailed {
		if vm.ResumeRefused = resumeRule(vm.Type); vm.ResumeRefused == "" {
			vm.Resume = &views.ResumeForm{CSRF: csrfToken(c), Key: newFormKey()}
		}
	}
	if u.IsAdmin() && vm.Resume == nil && (vm.Status == workflow.StatusFailed || vm.Status == workflow.StatusNeedsReconciliation) {
		// A resumable FAILED operation is resumed (the same run again from
		// its start); the retry from a step is for the rest (operations/retry.go).
		step, refusal := operations.RetryCandidate(app.engine, v.Operation)
		if refusal != nil {
			vm.RetryRefused = publicDetail(refusal)
		} else {
			vm.RetryFrom = &views.RetryForm{CSRF: csrfToken(c), Key: newFormKey(), Step: step,
				Seen: v.UpdatedAt.Format(time.RFC3339Nano)}
		}
	}
	if vm.Resume != nil || vm.RetryFrom != nil {
		vm.Stopped, vm.StoppedUnsure = stoppedOn(v.Operation)
	}
	if c.QueryParam("notice") == "duplicate-intent" {
		vm.Notice = "This policy already had a cancellation under way (from an earlier click or another tab), so no second one was started. This is it."
	}
	title, nav := "Cancellation", "policies"
	if vm.BookingID != 0 {
		title, nav = vm.Kind, "slots"
	}
	return render(c, http.StatusOK, views.OperationPage(app.page(c, title, nav), vm))
}

// handleOperationPanel: GET /operations/:id/panel — the htmx partial.
func (app *App) handleOperationPanel(c echo.Context) error {
	vm, err := app.operationPanel(c)
	if err != nil {
		return err
	}
	if shown := c.QueryParam("shown"); shown != "" && shown != vm.Shown {
		// What the page offers around the panel (Cancel, Resume, Retry from,
		// a booking's cancel) was chosen for another state: htmx loads the
		// whole page again, so no part of it disagrees with another.
		c.Response().Header().Set("HX-Refresh", "true")
	}
	return render(c, http.StatusOK, views.OperationPanel(vm))
}

// panelShown names the state of op that decides what its pages offer
// outside the self-refreshing panel: the status, a cancel requested, and,
// while it waits for a person, the updated_at a retry form carries (recovery
// asking again changes it). The panel's refresh compares it with the page's.
func panelShown(op workflow.Operation) string {
	s := op.Status
	if op.CancelRequestedAt != nil {
		s += "+cancel"
	}
	if op.Status == workflow.StatusNeedsReconciliation || op.Status == workflow.StatusFailed {
		s += "@" + op.UpdatedAt.UTC().Format(time.RFC3339Nano)
	}
	return s
}

// refreshEvery is how often op's panel refreshes itself: each second while it
// is live, every 5 s while it waits for a person (recovery still asks, and may
// finish it), never once it is final.
func refreshEvery(op workflow.Operation) string {
	switch {
	case !op.Terminal():
		return "1s"
	case op.Status == workflow.StatusNeedsReconciliation:
		return "5s"
	}
	return ""
}

// operationPanel is the view model both the page and its htmx partial show.
func (app *App) operationPanel(c echo.Context) (views.OperationDetail, error) {
	v, err := app.loadOperation(c.Request().Context(), c)
	if err != nil {
		return views.OperationDetail{}, err
	}
	u, _ := userFrom(c)
	return app.operationDetail(c.Request().Context(), v, u.IsAdmin())
}

func (app *App) operationDetail(ctx context.Context, v operationView, admin bool) (views.OperationDetail, error) {
	kind, subject := "Cancellation", ""
	if v.BookingID != 0 { // the deposit saga: its subject is a booking
		bk, err := app.slots.GetBooking(ctx, v.BookingID, v.UserID, true)
		if err != nil {
			return views.OperationDetail{}, err
		}
		kind, subject = sagaKind(v.Type), fmt.Sprintf("%s, %s", bk.Resource, bk.StartsAt.UTC().Format("Mon 2 Jan 15:04"))
	} else {
		pol, err := app.policies.Get(ctx, v.UserID, v.PolicyID)
		if err != nil {
			return views.OperationDetail{}, err
		}
		subject = pol.Number
	}
	vm := views.OperationDetail{
		ID: v.ID, Kind: kind, Type: v.Type, PolicyID: v.PolicyID, BookingID: v.BookingID, PolicyNumber: subject, Status: v.Status, Terminal: v.Terminal(),
		Admin: admin, Reason: v.Reason, Run: v.Run, Attempts: v.Attempts, MaxAttempts: app.recovery.Settings().Budget().MaxAttempts,
		Owner: database.Deref(v.OwnerID), LeaseExpires: timeText(v.LeaseExpiresAt), NextAttempt: timeText(v.NextAttemptAt),
		Released: releasedText(database.Deref(v.Released)), Finished: timeText(v.FinishedAt),
		RefreshEvery: refreshEvery(v.Operation), Shown: panelShown(v.Operation),
	}
	vm.Headline, vm.CountdownText, vm.Countdown = operationHeadline(v.Operation, time.Now())
	vm.Headline += appliedAfterAll(v.Operation, app.violationsNow(ctx))
	vm.RunAgain = runAgain(v.Type)
	vm.CancelState, vm.CancelLabel = cancelState(v.Operation), cancelLabel(v.Operation)
	vm.LastError, vm.LastErrorLabel = lastErrorShown(v.Operation)
	vm.Identities = app.identities(ctx, v, subject)
	current := ""
	for _, s := range v.Steps {
		if s.State != workflow.StepDone && current == "" {
			current = s.Name
		}
		step := views.Step{
			Position: s.Position, Name: s.Name, Key: s.Key, System: database.Deref(s.System), State: s.State, Attempts: s.Attempts,
			Deadline: timeText(s.DeadlineAt), Sent: timeText(s.SentAt), Finished: timeText(s.FinishedAt),
			Request: prettyJSON(s.Request), Answer: prettyJSON(s.Answer), Recorded: database.Deref(s.Truth),
			Current: s.Name == current && !v.Terminal(), TraceID: tracing.TraceID(database.Deref(s.Traceparent)),
		}
		if t, ok := v.Truths[s.Name]; ok {
			step.LiveTruth, step.LiveError = t.Truth, t.Error
		}
		vm.Steps = append(vm.Steps, step)
	}
	stepOf := map[string]string{}
	for _, s := range v.Steps {
		stepOf[s.Key] = s.Name
	}
	for _, cr := range v.Calls {
		line := views.CallLine{At: cr.At.UTC().Format("15:04:05.000"), Kind: cr.Kind, System: cr.System,
			Step: cmp.Or(stepOf[cr.StepKey], cr.StepKey), Actor: cr.Actor, What: callText(cr)}
		if cr.Kind == "status" && cr.Truth == nil {
			line.Error = cr.Detail
		}
		if cr.Attempt != nil {
			line.Attempt = fmt.Sprintf(" · call %d", *cr.Attempt) // the step's nth call sent: its "Calls sent"
		}
		if cr.DeadlineAt != nil {
			line.Deadline = timeText(cr.DeadlineAt)
		}
		vm.Calls = append(vm.Calls, line)
	}
	// The callbacks, among the calls in time order: the truth told, not asked.
	for _, cb := range v.Callbacks {
		what := fmt.Sprintf("called back %s · event %s · %s", cb.Status, cb.EventID, cb.Outcome)
		if cb.Duplicates > 0 {
			what += fmt.Sprintf(" (and %d more copies, which changed nothing)", cb.Duplicates)
		}
		vm.Calls = append(vm.Calls, views.CallLine{At: cb.ReceivedAt.UTC().Format("15:04:05.000"), Kind: "callback",
			System: cb.System, Step: cmp.Or(stepOf[cb.StepKey], cb.StepKey), Attempt: fmt.Sprintf(" · delivery attempt %d", cb.Attempt),
			What: what, Actor: "callback from " + cb.System})
	}
	slices.SortStableFunc(vm.Calls, func(a, b views.CallLine) int { return strings.Compare(a.At, b.At) })
	for _, e := range v.Timeline {
		te := views.TimelineEvent{
			ID: e.ID, At: e.At.UTC().Format("15:04:05.000"), From: database.Deref(e.FromStatus), To: e.ToStatus, Step: database.Deref(e.Step),
			Actor: e.Actor, Owner: shortToken(database.Deref(e.OwnerToken)), Detail: e.Detail, Statement: strings.TrimSpace(e.Statement),
		}
		te.StatementName, te.StatementWhere, te.StatementHref = statementLink(e.StatementName)
		vm.Timeline = append(vm.Timeline, te)
	}
	if !admin {
		vm = customerDetail(vm) // redact.go: the page's own parts, by the API's rule
	}
	return vm, nil
}

// runAgain says, per kind of operation, what starts a new run.
func runAgain(operationType string) string {
	switch operationType {
	case slots.OperationBookDeposit:
		return "a deposit booking has one run: when its deposit is refused the hold is released, and booking again is a new booking"
	case slots.OperationCancelDeposit:
		return "a booking's cancellation asked for again after its refund was refused starts a new run, with new step keys"
	}
	return "a cancellation asked for again after it failed starts a new run, with new step keys"
}

// appliedAfterAll is what the headline adds when the system's truth now
// contradicts a person's "mark failed": invariant 4 (a FAILED cancellation
// the provider applied) names op. The person's finding stays on the page as
// theirs; this says what the provider says ("" when it does not).
func appliedAfterAll(op workflow.Operation, broken []invariants.Violation) string {
	if op.Status != workflow.StatusFailed || op.PolicyID == 0 {
		return ""
	}
	for _, v := range broken {
		if v.Invariant == 4 && slices.Contains(v.IDs, op.ID) {
			return " The provider says it did apply it: the policy is cancelled there (invariant 4)."
		}
	}
	return ""
}

// operationHeadline says what op's status means right now, for the line
// under the title: for a live operation, whether recovery may take it and
// when (countdown: seconds from now, nil when no countdown applies).
func operationHeadline(op workflow.Operation, now time.Time) (headline, countdownText string, countdown *int) {
	switch op.Status {
	case workflow.StatusSucceeded:
		switch op.Type {
		case slots.OperationBookDeposit:
			return "Finished: every step is done — the deposit is charged and the slot is booked.", "", nil
		case slots.OperationCancelDeposit:
			return "Finished: every step is done — the deposit is refunded and the slot is free again.", "", nil
		}
		if op.PolicyID != 0 {
			return "Finished: every step is done — the policy is cancelled.", "", nil
		}
		return "Finished: every step is done.", "", nil
	case workflow.StatusFailed:
		if op.CancelRequestedAt != nil { // stopped by a person, not refused: the cancel-state line says how
			return "Finished early: an admin stopped it, and nothing was left half done.", "", nil
		}
		switch op.Type {
		case slots.OperationBookDeposit:
			return "Finished without booking: the deposit was not charged, and the hold on the slot was released — nothing was left half done.", "", nil
		case slots.OperationCancelDeposit:
			return "Finished without cancelling the booking: the refund was refused, so the booking stands — nothing was left half done.", "", nil
		}
		if howFailed(op, policies.StepProviderCancel) == "a person" {
			// A person's decision, not the provider's answer: never "refused",
			// and never "found" — they decided on what they knew (the desk's note).
			return "Finished without cancelling: a person marked it failed, on their finding that the provider never applied it.", "", nil
		}
		return "Finished without cancelling: it was refused, and nothing was left half done.", "", nil
	case workflow.StatusNeedsReconciliation:
		// The step it stopped at, as the desk's card names it.
		st, ok := op.Stuck()
		switch {
		case ok && !st.External() && op.CancelRequestedAt != nil:
			return "Waiting for a person: it was cancelled before " + st.Name + ", after an earlier step had taken effect elsewhere, and nothing undoes that automatically. Nothing more happens on its own until they decide.", "", nil
		case ok && st.External() && st.State == workflow.StepFailed:
			return "Waiting for a person to decide: " + database.Deref(st.System) + " refused " + st.Name + ", and what the earlier steps did elsewhere stands. Nothing more happens on its own until they decide.", "", nil
		case ok && st.External() && op.NextAttemptAt != nil:
			// Recovery still asks while a person is awaited (sqlReconcile's
			// next_attempt_at): the answer may settle it before they decide.
			return "Waiting for a person to confirm with the " + database.Deref(st.System) + ": the outcome of " + st.Name + " is not known. Recovery still asks the " +
				database.Deref(st.System) + " now and then — next at " + timeText(op.NextAttemptAt) + " — and finishes it on its own if the answer settles it; otherwise a person decides.", "", nil
		case ok && st.External():
			return "Waiting for a person to confirm with the " + database.Deref(st.System) + ": the outcome of " + st.Name + " is not known, and nothing more happens on its own until they decide.", "", nil
		}
		return "Waiting for a person: nothing more happens on its own until they decide.", "", nil
	}
	// Live: recovery may claim it once its lease is over and its backoff.
	claimable := op.LeaseExpiresAt
	if op.NextAttemptAt != nil && (claimable == nil || op.NextAttemptAt.After(*claimable)) {
		claimable = op.NextAttemptAt
	}
	secs := 0
	if claimable != nil && claimable.After(now) {
		secs = int(math.Ceil(claimable.Sub(now).Seconds()))
	}
	switch database.Deref(op.Released) {
	case workflow.ReleasedHandedOver:
		headline, countdownText = "The request met an outcome it could not know and handed the operation to recovery on purpose:", "recovery may claim this in %s."
	case workflow.ReleasedBackedOff:
		headline, countdownText = "Recovery learned nothing on its last try and is backing off:", "recovery may claim this again in %s."
	case workflow.ReleasedRetryRequested:
		headline, countdownText = "A person asked for another try:", "recovery may claim this in %s."
	default:
		if secs == 0 {
			headline, countdownText = "Its owner's lease has run out — the owner looks dead (a crash, a lost connection):", "recovery may claim this in %s."
		} else {
			owner := cmp.Or(database.Deref(op.OwnerID), "its owner")
			headline = "In progress: " + owner + " holds the lease and is working on it. If it stops (a crash),"
			countdownText = "recovery may claim this in %s, when the lease runs out."
		}
	}
	return headline, countdownText, &secs
}

// lastErrorShown is the last error when it still says something, with the
// name it goes by: on a live operation, what went wrong last; on a failed
// or waiting one, why it ended so. A succeeded operation has none.
func lastErrorShown(op workflow.Operation) (text, label string) {
	switch op.Status {
	case workflow.StatusSucceeded:
		return "", ""
	case workflow.StatusFailed:
		return database.Deref(op.LastError), "Why it failed"
	case workflow.StatusNeedsReconciliation:
		return database.Deref(op.LastError), "Why a person decides"
	}
	return database.Deref(op.LastError), "Last error"
}

// The lines of code behind the identities, found by what they say.
var (
	codeKeyClaim      = codeRef{"internal/idempotency/store.go", "INSERT INTO idempotency_keys ("}
	codeBusinessClaim = codeRef{"internal/policies/cancel.go", "ON CONFLICT (policy_id, operation_type) DO NOTHING -- the intent exists already: 0 rows"}
	codeStepKey       = codeRef{"internal/workflow/operation.go", "func StepKey(operationID int64, step string, run int) string {"}
)

// codeRef is one line of the embedded source, by its whole trimmed text.
type codeRef struct{ Path, Text string }

func (r codeRef) where() (string, string) {
	line := idemlab.LineOf(r.Path, r.Text)
	return fmt.Sprintf("%s:%d", r.Path, line), CodeHref(r.Path, line)
}

// identities are the three keys that keep op from happening twice: the
// request's Idempotency-Key, the business identity, each step's key.
func (app *App) identities(ctx context.Context, v operationView, subject string) []views.Identity {
	req := views.Identity{Name: "Request", Value: v.IdempotencyKey,
		Prevents: "the same request sent twice (a double-click, a client's retry) running twice: the second gets the stored answer."}
	switch rec, err := app.idempotency.Lookup(ctx, v.UserID, v.IdempotencyKey); {
	case errors.Is(err, idempotency.ErrNotFound):
		req.State = "purged after its retention: the operation stays, the key may be used afresh"
	case err != nil:
		req.State = "cannot be read right now"
	case rec.Status == idempotency.StatusCompleted:
		req.State = fmt.Sprintf("claimed, then completed: answer %d stored, replayed to every retry", rec.Response.Status)
		if rec.Response.Status == http.StatusAccepted { // true for good, while the operation moves on
			req.State += " — the answer the request gave when it handed the operation to recovery; what happened since is on this page"
		}
	default:
		req.State = keyLeaseState(rec)
	}
	req.Code, req.CodeHref = codeKeyClaim.where()
	biz := views.Identity{Name: "Business", Value: subject + " · " + v.Type,
		State:    "one " + v.Type + " per policy, whatever the key",
		Prevents: "a second cancellation of the same policy from another tab or a new key: it is sent to this one (duplicate-intent)."}
	biz.Code, biz.CodeHref = codeBusinessClaim.where()
	if v.BookingID != 0 { // the deposit saga: one operation of each type per booking
		biz.State = "one " + v.Type + " per booking, whatever the key"
		biz.Prevents = "a second " + strings.ToLower(sagaKind(v.Type)) + " of the same booking from another tab or a new key."
		biz.Code, biz.CodeHref = "migrations/00147_fewer_index_entries.sql", CodeHref("migrations/00147_fewer_index_entries.sql",
			idemlab.LineOf("migrations/00147_fewer_index_entries.sql", "CREATE UNIQUE INDEX operations_booking_type_key ON operations (booking_id, operation_type) WHERE booking_id IS NOT NULL;"))
	}
	ids := []views.Identity{req, biz}
	for _, s := range v.Steps {
		if !s.External() {
			continue
		}
		id := views.Identity{Name: "External: " + s.Name, Value: s.Key, State: "sent as Idempotency-Key to " + database.Deref(s.System),
			Prevents: database.Deref(s.System) + " applying the step twice when it is sent again (after a lost answer, a crash, by recovery)."}
		id.Code, id.CodeHref = codeStepKey.where()
		ids = append(ids, id)
	}
	return ids
}

// keyLeaseState says what a request key still in progress means, true
// whenever it is read (the panel stops refreshing once the operation is
// final, and a crashed request's key outlives it): its lease's end, and what
// a retry with the key meets before and after it.
func keyLeaseState(rec *idempotency.Record) string {
	until := rec.LeaseExpiresAt.UTC().Format("15:04:05 MST")
	if rec.LeaseExpired {
		return "claimed by a request that never answered; its lease ran out at " + until + ": a retry with this key takes it over"
	}
	return "claimed by a request, leased until " + until + ": until then a retry with this key waits or is told it is in progress, after it the retry takes the key over"
}

// statementLink is a timeline line's statement ("workflow.sqlStepSent") as
// the page shows it: the constant, "path:line" and the viewer's link to its
// declaration in internal/workflow ("" when it is not found).
func statementLink(name string) (ident, where, href string) {
	pkg, ident, ok := strings.Cut(name, ".")
	if !ok {
		return name, "", ""
	}
	path, line := idemlab.DeclLine("internal/"+pkg, ident)
	if line == 0 {
		return ident, "", ""
	}
	return ident, fmt.Sprintf("%s:%d", path, line), CodeHref(path, line)
}

// callText says what one exchange was.
func callText(c readmodel.CallRecord) string {
	switch c.Kind {
	case "call":
		return "sent " + c.StepKey + " " + string(c.Request)
	case "answer":
		s := "answer: " + database.Deref(c.Outcome)
		if c.Truth != nil {
			s += " (" + *c.Truth + ")"
		}
		if c.Detail != "" {
			s += " — " + c.Detail
		}
		if c.TookMS != nil {
			s += fmt.Sprintf(", after %d ms", *c.TookMS)
		}
		return s
	default:
		s := "status of " + c.StepKey + ": "
		if c.Truth != nil {
			s += *c.Truth
		} else {
			s += "could not be asked:"
		}
		return s
	}
}

// releasedText says why a live operation's lease ended early.
func releasedText(r string) string {
	switch r {
	case workflow.ReleasedHandedOver:
		return "handed to recovery on purpose"
	case workflow.ReleasedBackedOff:
		return "released: backing off"
	case workflow.ReleasedRetryRequested:
		return "handed back to recovery by a person"
	}
	return ""
}

func prettyJSON(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
}

func timeText(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format("15:04:05.000 MST")
}

// shortToken shows the start of an owner token: enough to tell owners apart.
func shortToken(tok string) string {
	if len(tok) > 8 {
		return tok[:8]
	}
	return tok
}

// stoppedOn says on whose word the step the operation stopped at failed
// (third read: "Resume" said "the other system refused it … never a repeat
// of the refused one" of a cancellation a person had marked failed while
// the provider had in fact applied it; resuming cancelled it twice).
// unsure: nobody knows the call did not take effect, so a new key may do
// it again.
func stoppedOn(op workflow.Operation) (why string, unsure bool) {
	for _, st := range op.Steps {
		if st.State == workflow.StepCancelled {
			return "it was cancelled before " + st.Name + ", which never ran.", false
		}
		if st.State != workflow.StepFailed && st.State != workflow.StepUnknown && st.State != workflow.StepSent {
			continue
		}
		switch {
		case st.System == nil:
			return st.Name + " is a step of this app's own, which calls no other system.", false
		case st.Truth != nil && *st.Truth == string(external.TruthRejected):
			return "the other system, " + *st.System + ", refused " + st.Name + ".", false
		case st.Truth != nil && *st.Truth == string(external.TruthNotStarted):
			return st.Name + " is known never to have taken effect (" + *st.System + " has no record of it).", false
		}
		return "not on the word of " + *st.System + ": a person (or a cancel) stopped it while the outcome of " + st.Name + " was unknown.", true
	}
	return "no step is recorded as failed.", false
}
