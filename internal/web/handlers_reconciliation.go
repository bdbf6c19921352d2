package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/database"
	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/readmodel"
	"github.com/idemlab/idemlab/internal/reconciliation"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// The reconciliation desk (docs/reconciliation.md): the operations waiting
// for a person, their evidence and advice (reconciliation.Advise), "ask again",
// decisions one at a time or in bulk, and the audit trail. Every handler
// here is admin-only; the API and the forms are thin renderers of the same
// engine calls.

const (
	deskLimit     = 1000 // the most items the desk reads at once
	maxBatch      = 1000 // the most decisions one bulk request carries
	askTimeout    = 3 * time.Second
	decisionsShow = 50
	cardsShow     = 50 // cards on the page; the bulk actions cover every item the filter matches
)

// truthFilters are the values ?truth= accepts, in the order the desk shows them.
var truthFilters = []string{reconciliation.TruthUnknown, "COMPLETED", "NOT_STARTED", reconciliation.TruthNotStartedPending, "RUNNING", "REJECTED"}

var truthLabels = map[string]string{
	reconciliation.TruthUnknown: "no answer", "COMPLETED": "COMPLETED", "NOT_STARTED": "NOT_STARTED, conclusive",
	reconciliation.TruthNotStartedPending: "NOT_STARTED, a call may arrive", "RUNNING": "RUNNING", "REJECTED": "REJECTED",
}

var reasonLabels = map[reconciliation.Reason]string{
	reconciliation.ReasonOutOfAttempts: "out of attempts", reconciliation.ReasonRefused: "refused", reconciliation.ReasonInconsistent: "inconsistent",
	reconciliation.ReasonCancelled: "cancelled after an effect",
}

func (app *App) deskConfig() reconciliation.Config {
	b := app.recovery.Settings().Budget()
	return reconciliation.Config{ClockSkew: b.ClockSkew, MaxAttempts: b.MaxAttempts}
}

// deskFilter is ?reason= and ?truth=; each empty or one known value.
type deskFilter struct{ Reason, Truth string }

func parseDeskFilter(q url.Values) (deskFilter, error) {
	f := deskFilter{Reason: q.Get("reason"), Truth: q.Get("truth")}
	if f.Reason != "" && !slices.Contains(reconciliation.Reasons, reconciliation.Reason(f.Reason)) {
		names := make([]string, len(reconciliation.Reasons))
		for i, r := range reconciliation.Reasons {
			names[i] = string(r)
		}
		return f, invalidParam("reason", "reason must be one of "+strings.Join(names, ", "))
	}
	if f.Truth != "" && !slices.Contains(truthFilters, f.Truth) {
		return f, invalidParam("truth", "truth must be one of "+strings.Join(truthFilters, ", "))
	}
	return f, nil
}

func (f deskFilter) query() string {
	q := url.Values{}
	if f.Reason != "" {
		q.Set("reason", f.Reason)
	}
	if f.Truth != "" {
		q.Set("truth", f.Truth)
	}
	return q.Encode()
}

func (f deskFilter) match(it reconciliation.Item) bool {
	return (f.Reason == "" || string(it.Facts.Reason) == f.Reason) && (f.Truth == "" || it.Truth() == f.Truth)
}

// desk is what GET /api/v1/reconciliation answers and the desk page shows.
type desk struct {
	Total    int            `json:"total"`
	ByReason map[string]int `json:"by_reason"`
	ByTruth  map[string]int `json:"by_truth"`
	Items    []deskItem     `json:"items"`
	all      []reconciliation.Item
	shown    []reconciliation.Item
}

// deskItem is one item as the API shows it.
type deskItem struct {
	OperationID   int64                 `json:"operation_id"`
	Type          string                `json:"operation_type"`
	PolicyID      int64                 `json:"policy_id,omitempty"`
	BookingID     int64                 `json:"booking_id,omitempty"`
	Step          string                `json:"step"`
	System        string                `json:"system"`
	StepKey       string                `json:"step_key"`
	Reason        string                `json:"reason"`
	TruthThen     string                `json:"truth_then"`
	TruthNow      string                `json:"truth_now"`
	TruthNowAt    *time.Time            `json:"truth_now_at"`
	ArrivesUntil  *time.Time            `json:"calls_may_arrive_until"`
	SeenUpdatedAt time.Time             `json:"seen_updated_at"`
	HandedOverAt  time.Time             `json:"handed_over_at"`
	Attempts      int                   `json:"attempts"`
	Advice        reconciliation.Advice `json:"advice"`
}

func toDeskItem(it reconciliation.Item) deskItem {
	d := deskItem{
		OperationID: it.Operation.ID, Type: it.Operation.Type, PolicyID: it.Operation.PolicyID, BookingID: it.Operation.BookingID,
		Step: it.Stuck.Name, System: it.Facts.System, StepKey: it.Stuck.Key, Reason: string(it.Facts.Reason),
		TruthThen: string(it.Facts.Then), TruthNow: it.Truth(), SeenUpdatedAt: it.Operation.UpdatedAt,
		HandedOverAt: it.HandedOver, Attempts: it.Operation.Attempts, Advice: it.Advice,
	}
	if d.TruthThen == "" {
		d.TruthThen = reconciliation.TruthUnknown
	}
	if !it.Facts.NowAt.IsZero() {
		d.TruthNowAt = &it.Facts.NowAt
	}
	if !it.Facts.ArrivesUntil.IsZero() {
		d.ArrivesUntil = &it.Facts.ArrivesUntil
	}
	return d
}

func (app *App) readDesk(ctx context.Context, f deskFilter) (desk, error) {
	all, err := app.desk.Waiting(ctx, app.deskConfig(), deskLimit)
	if err != nil {
		return desk{}, err
	}
	d := desk{Total: len(all), ByReason: map[string]int{}, ByTruth: map[string]int{}, Items: []deskItem{}, all: all}
	for _, r := range reconciliation.Reasons {
		d.ByReason[string(r)] = 0
	}
	for _, t := range truthFilters {
		d.ByTruth[t] = 0
	}
	for _, it := range all {
		d.ByReason[string(it.Facts.Reason)]++
		d.ByTruth[it.Truth()]++
		if f.match(it) {
			d.shown = append(d.shown, it)
			d.Items = append(d.Items, toDeskItem(it))
		}
	}
	return d, nil
}

// handleDeskAPI: GET /api/v1/reconciliation (admin) — counts by reason and
// truth now, and the items the filter shows with their advice.
func (app *App) handleDeskAPI(c echo.Context) error {
	f, err := parseDeskFilter(c.QueryParams())
	if err != nil {
		return err
	}
	d, err := app.readDesk(c.Request().Context(), f)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}

// handleReconciliationAPI: GET /api/v1/admin/reconciliation (admin) — the
// operations waiting for a person, as they are (the older list; the desk's
// is /api/v1/reconciliation).
func (app *App) handleReconciliationAPI(c echo.Context) error {
	ops, err := app.engine.ListByStatus(c.Request().Context(), workflow.StatusNeedsReconciliation, 100)
	if err != nil {
		return err
	}
	if ops == nil {
		ops = []workflow.Operation{}
	}
	return c.JSON(http.StatusOK, map[string]any{"items": ops})
}

// handleReconciliationPage: GET /reconciliation (admin) — the desk.
func (app *App) handleReconciliationPage(c echo.Context) error {
	ctx := c.Request().Context()
	f, err := parseDeskFilter(c.QueryParams())
	if err != nil {
		return err
	}
	d, err := app.readDesk(ctx, f)
	if err != nil {
		return err
	}
	decided, err := app.desk.Decisions(ctx, 0, decisionsShow)
	if err != nil {
		return err
	}
	v := views.DeskView{Total: d.Total, Reason: f.Reason, Truth: f.Truth, Query: f.query(), NoteMax: maxTextLength,
		Notice: deskNotice(c.QueryParams())}
	for _, r := range reconciliation.Reasons {
		g := deskFilter{Reason: string(r), Truth: f.Truth}
		if f.Reason == string(r) {
			g.Reason = ""
		}
		v.ByReason = append(v.ByReason, views.DeskCount{Key: string(r), Label: reasonLabels[r], N: d.ByReason[string(r)],
			Href: "/reconciliation?" + g.query(), Active: f.Reason == string(r)})
	}
	for _, t := range truthFilters {
		g := deskFilter{Reason: f.Reason, Truth: t}
		if f.Truth == t {
			g.Truth = ""
		}
		v.ByTruth = append(v.ByTruth, views.DeskCount{Key: t, Label: truthLabels[t], N: d.ByTruth[t],
			Href: "/reconciliation?" + g.query(), Active: f.Truth == t})
	}
	bulk := map[string]*views.BulkDecision{}
	v.Matching = len(d.shown)
	for i, it := range d.shown {
		card := deskCard(it)
		if i < cardsShow {
			v.Items = append(v.Items, card)
		}
		if ask, _ := it.Advice.Action(reconciliation.ActionAskAgain); ask.Enabled {
			// Only what there is a system to ask about: the notice's count
			// of items no longer waiting is then the posted minus the asked.
			v.AskIDs = append(v.AskIDs, strconv.FormatInt(it.Operation.ID, 10))
		}
		if !it.Advice.Unambiguous {
			continue
		}
		b := bulk[it.Advice.Suggested]
		if b == nil {
			b = &views.BulkDecision{Action: it.Advice.Suggested, Key: newFormKey()}
			bulk[it.Advice.Suggested] = b
		}
		b.Items = append(b.Items, fmt.Sprintf("%d|%s|%s", it.Operation.ID, card.SeenUpdatedAt, card.Truth))
	}
	for _, action := range []string{string(reconciliation.ResolveDone), string(reconciliation.ResolveRetry), string(reconciliation.ResolveFailed)} {
		b := bulk[action]
		if b == nil {
			continue
		}
		n := views.Plural(len(b.Items), "item")
		switch action {
		case string(reconciliation.ResolveDone):
			b.Label, b.Why = "Mark done: "+n, "Their systems say COMPLETED: the effect happened, no second call is needed."
		case string(reconciliation.ResolveRetry):
			b.Label, b.Why = "Hand back to recovery: "+n, "Their systems have no record of the call and every deadline has passed: recovery sends the same call, same key — safe whatever the belief about idempotency: none applied the first, and a late copy is refused after its deadline."
		default:
			b.Label, b.Why = "Mark failed: "+n, "Their systems refused the call and nothing was applied."
		}
		v.Bulk = append(v.Bulk, *b)
	}
	for _, dd := range decided {
		v.Decisions = append(v.Decisions, decisionRow(dd))
	}
	return render(c, http.StatusOK, views.ReconciliationPage(app.page(c, "Reconciliation", "reconciliation"), v))
}

// deskNotice words what the last post did; it names only numbers that
// parse (a query string is anyone's to write).
func deskNotice(q url.Values) string {
	num := func(k string) (int, bool) {
		n, err := strconv.Atoi(q.Get(k))
		return n, err == nil && n >= 0
	}
	if asked, ok := num("asked"); ok {
		answered, _ := num("answered")
		posted, _ := num("posted")
		waiting, ok := num("waiting")
		if !ok {
			waiting = -1 // not said: nothing is claimed about it
		}
		byRecovery, _ := num("by_recovery")
		byPerson, _ := num("by_person")
		return askNotice(asked, answered, posted, waiting, byRecovery, byPerson)
	}
	if decided, ok := num("decided"); ok {
		changed, _ := num("changed")
		refused, _ := num("refused")
		s := fmt.Sprintf("%d decided.", decided)
		if changed > 0 {
			s += fmt.Sprintf(" %d had changed since shown (someone else, or recovery, got there first): not applied.", changed)
		}
		if refused > 0 {
			s += fmt.Sprintf(" %d refused: the evidence no longer allows that decision.", refused)
		}
		return s + " Each decision is on its operation's timeline and in the list below."
	}
	if id, err := parseID(q.Get("resolved")); err == nil {
		if action, ok := reconciliation.ParseResolution(q.Get("action")); ok {
			return fmt.Sprintf("Operation #%d: decision recorded — %s. It is on the operation's timeline.", id,
				reconciliation.DecisionWords(string(action)))
		}
	}
	return ""
}

// askNotice says what asking again did, and what became of the items
// asked about (issue 29, finding 16): recovery asks on its own too, and
// when it settled them first — before the press, or while the person's
// questions were on their way — the desk says so instead of "0 of 0
// answered" above an empty desk. Of posted items, those not asked had
// stopped waiting before the press; the rest of those gone, during it.
func askNotice(asked, answered, posted, waiting, byRecovery, byPerson int) string {
	var s string
	if asked > 0 {
		s = fmt.Sprintf("Asked again: %d of %d answered.", answered, asked)
	} else {
		s = "Nothing was asked again."
	}
	if gone := byRecovery + byPerson; gone > 0 {
		var who []string
		if byRecovery > 0 {
			who = append(who, fmt.Sprintf("recovery settled %d on its own (it asks again too, and learned the truth)", byRecovery))
		}
		if byPerson > 0 {
			who = append(who, fmt.Sprintf("another admin decided %d", byPerson))
		}
		before := min(max(posted-asked, 0), gone)
		var when string
		switch {
		case before == gone:
			when = "before you asked"
		case before == 0:
			when = "while you asked"
		default:
			when = fmt.Sprintf("%d before you asked, %d while you asked", before, gone-before)
		}
		s += fmt.Sprintf(" %d of the %d you asked about no longer %s for a person: %s — %s. Their operation pages say how.",
			gone, max(posted, gone), verb(gone, "waits", "wait"), strings.Join(who, "; "), when)
	}
	switch {
	case waiting > 0 && asked > 0:
		s += " The cards below advise from the new answers."
	case waiting == 0 && posted > 0:
		s += " None of them waits for a person now."
	}
	return s
}

func verb(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// deskCard is an item as its card shows it.
func deskCard(it reconciliation.Item) views.DeskItem {
	op := it.Operation
	card := views.DeskItem{
		ID: op.ID, PolicyNumber: op.Subject(), Step: it.Stuck.Name, System: it.Facts.System, StepKey: it.Stuck.Key,
		Attempts: op.Attempts, Since: it.HandedOver.UTC().Format("15:04:05 MST"), Reason: string(it.Facts.Reason),
		Truth: it.Truth(), Headline: it.Advice.Headline, Why: it.Advice.Why, Then: it.Advice.Then, Now: it.Advice.Now,
		Suggested: it.Advice.Suggested, Suggestion: it.Advice.Suggestion, Unambiguous: it.Advice.Unambiguous,
		SeenUpdatedAt: op.UpdatedAt.Format(time.RFC3339Nano),
	}
	for _, ch := range it.Advice.Actions {
		a := views.DeskAction{Action: ch.Action, Label: ch.Label, Enabled: ch.Enabled, Disabled: ch.Disabled, Caution: ch.Caution,
			Primary: ch.Action == it.Advice.Suggested}
		if ch.Action != reconciliation.ActionAskAgain {
			a.Key = newFormKey()
		}
		card.Actions = append(card.Actions, a)
	}
	return card
}

func decisionRow(d reconciliation.Decision) views.DecisionRow {
	return views.DecisionRow{At: d.At.UTC().Format("15:04:05 MST"), OperationID: d.OperationID, DecidedBy: d.DecidedBy,
		Decision: reconciliation.DecisionWords(d.Decision), TruthSeen: d.TruthSeen, Suggested: d.Suggested, BatchSize: d.BatchSize, Note: d.Note}
}

// handleReconcileBadge: GET /reconciliation/badge (admin) — the nav's count.
func (app *App) handleReconcileBadge(c echo.Context) error {
	n, err := app.desk.CountWaiting(c.Request().Context())
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.ReconcileBadge(n))
}

// evidence is GET /api/v1/reconciliation/{id}: one operation's evidence.
type evidence struct {
	Waiting   bool                      `json:"waiting"`
	Item      *deskItem                 `json:"item,omitempty"`
	Operation workflow.Operation        `json:"operation"`
	Calls     []readmodel.CallRecord    `json:"calls"`
	Ledger    *ledgerLine               `json:"ledger"`
	Timeline  []readmodel.Event         `json:"timeline"`
	Decisions []reconciliation.Decision `json:"decisions"`
}

// ledgerLine is the stuck step's system's own ledger for the operation's
// subject, as its control API reports it.
type ledgerLine struct {
	System   string `json:"system"`
	PolicyID int64  `json:"policy_id"`
	Effects  int64  `json:"effects"`
	Pending  int64  `json:"pending"`
	Error    string `json:"error,omitempty"`
}

func (l *ledgerLine) String() string {
	if l == nil {
		return "No ledger to show for this step."
	}
	if l.Error != "" {
		return l.System + "'s ledger could not be read: " + l.Error
	}
	noun := "effects"
	if l.System == "payments" {
		noun = "refunds"
	}
	return fmt.Sprintf("%s's ledger for policy %d: %d %s applied, %d pending.", l.System, l.PolicyID, l.Effects, noun, l.Pending)
}

func (app *App) ledger(ctx context.Context, system string, policyID int64) *ledgerLine {
	l := &ledgerLine{System: system, PolicyID: policyID}
	switch {
	case policyID == 0:
		return nil
	case system == "provider" && app.providerControl != nil:
		e, err := app.providerControl.Effects(ctx)
		if err != nil {
			l.Error = err.Error()
			return l
		}
		for _, pe := range e.ByPolicy {
			if pe.PolicyID == policyID {
				l.Effects, l.Pending = pe.Count, pe.Pending
			}
		}
	case system == "payments" && app.paymentsControl != nil:
		led, err := app.paymentsControl.Ledger(ctx)
		if err != nil {
			l.Error = err.Error()
			return l
		}
		for _, s := range led.BySubject {
			if s.PolicyID != nil && *s.PolicyID == policyID {
				l.Effects = s.Refunds
			}
		}
	default:
		return nil
	}
	return l
}

func (app *App) readEvidence(ctx context.Context, id int64) (evidence, error) {
	op, err := app.engine.GetOperation(ctx, id, 0, true)
	if err != nil {
		return evidence{}, err
	}
	ev := evidence{Operation: op}
	item, err := app.desk.WaitingItem(ctx, app.deskConfig(), id)
	switch {
	case err == nil:
		d := toDeskItem(item)
		ev.Waiting, ev.Item = true, &d
		ev.Ledger = app.ledger(ctx, item.Facts.System, op.PolicyID)
	case !errors.Is(err, reconciliation.ErrNotWaiting):
		return evidence{}, err
	}
	if ev.Calls, err = readmodel.Calls(ctx, app.pool, id); err != nil {
		return evidence{}, err
	}
	if ev.Timeline, err = readmodel.Timeline(ctx, app.pool, id); err != nil {
		return evidence{}, err
	}
	if ev.Decisions, err = app.desk.Decisions(ctx, id, 100); err != nil {
		return evidence{}, err
	}
	return ev, nil
}

// handleEvidenceAPI: GET /api/v1/reconciliation/items/{id} (admin).
func (app *App) handleEvidenceAPI(c echo.Context) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ev, err := app.readEvidence(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ev)
}

// handleEvidencePage: GET /reconciliation/items/{id} (admin) — the card, every
// call and status answer, the ledger, the decisions and the timeline.
func (app *App) handleEvidencePage(c echo.Context) error {
	ctx := c.Request().Context()
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	ev, err := app.readEvidence(ctx, id)
	if err != nil {
		return err
	}
	v := views.EvidenceView{Waiting: ev.Waiting, Status: ev.Operation.Status, NoteMax: maxTextLength, Ledger: ev.Ledger.String()}
	v.Item.ID = id
	if ev.Waiting {
		item, err := app.desk.WaitingItem(ctx, app.deskConfig(), id)
		if err != nil && !errors.Is(err, reconciliation.ErrNotWaiting) {
			return err
		}
		v.Item = deskCard(item)
	}
	for _, cr := range ev.Calls {
		row := views.EvidenceCall{At: cr.At.UTC().Format("15:04:05.000"), Kind: cr.Kind, Key: cr.StepKey, Actor: cr.Actor, Detail: cr.Detail}
		if cr.DeadlineAt != nil {
			row.Deadline = cr.DeadlineAt.UTC().Format("15:04:05.000")
		}
		switch {
		case cr.Kind == "call":
			row.Answer = "sent"
			if cr.Attempt != nil {
				row.Answer = fmt.Sprintf("sent (call %d)", *cr.Attempt) // a step's sends are calls; attempts are the operation's
			}
		case cr.Truth != nil:
			row.Answer = *cr.Truth
			if cr.Outcome != nil {
				row.Answer = *cr.Outcome + ", " + *cr.Truth
			}
		case cr.Outcome != nil:
			row.Answer = *cr.Outcome
		default:
			row.Answer = "nothing came back"
		}
		v.Calls = append(v.Calls, row)
	}
	for _, e := range ev.Timeline {
		v.Timeline = append(v.Timeline, views.TimelineEvent{At: e.At.UTC().Format("15:04:05.000"), From: database.Deref(e.FromStatus),
			To: e.ToStatus, Step: database.Deref(e.Step), Actor: e.Actor, Detail: e.Detail})
	}
	for _, d := range ev.Decisions {
		v.Decided = append(v.Decided, decisionRow(d))
	}
	return render(c, http.StatusOK, views.EvidencePage(app.page(c, fmt.Sprintf("Operation #%d: evidence", id), "reconciliation"), v))
}

// handleDecisionsAPI: GET /api/v1/reconciliation/decisions (admin) — the
// audit trail, newest first; ?operation_id= for one operation's.
func (app *App) handleDecisionsAPI(c echo.Context) error {
	var opID int64
	if v := c.QueryParam("operation_id"); v != "" {
		id, err := parseID(v)
		if err != nil {
			return invalidParam("operation_id", "operation_id must be a positive whole number")
		}
		opID = id
	}
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	list, err := app.desk.Decisions(c.Request().Context(), opID, lp.Limit)
	if err != nil {
		return err
	}
	if list == nil {
		list = []reconciliation.Decision{}
	}
	return c.JSON(http.StatusOK, map[string]any{"decisions": list})
}

// askBody is the JSON of POST /api/v1/reconciliation/ask.
type askBody struct {
	IDs []int64 `json:"operation_ids"`
}

// handleAskAPI: POST /api/v1/reconciliation/ask (admin) — ask the systems
// again for the given operations (all waiting ones when none are given).
// No Idempotency-Key: asking decides nothing; a repeat adds evidence.
func (app *App) handleAskAPI(c echo.Context) error {
	var in askBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	if len(in.IDs) > deskLimit {
		return refuse(errValidation, "Too many operations",
			fmt.Sprintf("operation_ids may name at most %d operations", deskLimit)).With("field", "operation_ids")
	}
	ids, err := app.askIDs(c.Request().Context(), in.IDs)
	if err != nil {
		return err
	}
	asked, answered, err := app.desk.AskAgain(c.Request().Context(), ids, app.personActor(c), askTimeout)
	if err != nil {
		return err
	}
	settled, err := app.desk.Settled(c.Request().Context(), ids)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, askAnswer{Asked: asked, Answered: answered, Settled: settled})
}

// askAnswer is what asking again answers: how many were asked and
// answered, and what became of the operations named — recovery asks on its
// own too, and may have settled some before or while they were asked.
type askAnswer struct {
	Asked    int `json:"asked"`
	Answered int `json:"answered"`
	reconciliation.Settled
}

// askIDs is ids, or every waiting operation when ids is empty.
func (app *App) askIDs(ctx context.Context, ids []int64) ([]int64, error) {
	if len(ids) > 0 {
		return ids, nil
	}
	ops, err := app.engine.ListByStatus(ctx, workflow.StatusNeedsReconciliation, deskLimit)
	if err != nil {
		return nil, err
	}
	for _, op := range ops {
		ids = append(ids, op.ID)
	}
	return ids, nil
}

// handleAskForm: POST /reconciliation/ask (admin form) — ask again for the
// ids posted (one card, or all shown), then back to the desk.
func (app *App) handleAskForm(c echo.Context) error {
	form, err := c.FormParams()
	if err != nil {
		return err
	}
	if len(form["id"]) > deskLimit {
		return invalidParam("id", fmt.Sprintf("at most %d operations at once", deskLimit))
	}
	var ids []int64
	for _, v := range form["id"] {
		id, err := parseID(v)
		if err != nil {
			return invalidParam("id", "every id must be a positive whole number")
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return invalidParam("id", "name at least one operation to ask about")
	}
	asked, answered, err := app.desk.AskAgain(c.Request().Context(), ids, app.personActor(c), askTimeout)
	if err != nil {
		return err
	}
	// Read after the asking: recovery may have taken an item back while it
	// was asked, not only before.
	settled, err := app.desk.Settled(c.Request().Context(), ids)
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, deskURL(c.FormValue("return"), url.Values{
		"asked": {strconv.Itoa(asked)}, "answered": {strconv.Itoa(answered)}, "posted": {strconv.Itoa(len(ids))},
		"waiting": {strconv.Itoa(settled.Waiting)}, "by_recovery": {strconv.Itoa(settled.ByRecovery)},
		"by_person": {strconv.Itoa(settled.ByPerson)}}))
}

// deskURL is the desk with the posted filter (only what parses) and extra.
func deskURL(ret string, extra url.Values) string {
	q, _ := url.ParseQuery(ret)
	f, err := parseDeskFilter(q)
	if err != nil {
		f = deskFilter{}
	}
	out, _ := url.ParseQuery(f.query())
	for k, v := range extra {
		out[k] = v
	}
	return "/reconciliation?" + out.Encode()
}

// personActor names the admin and the request on the evidence they add.
func (app *App) personActor(c echo.Context) string {
	u, _ := userFrom(c)
	return u.Name + " (admin, " + app.actor(c) + ")"
}

// resolveBody is the JSON of POST /api/v1/admin/operations/{id}/resolve.
type resolveBody struct {
	Action        string    `json:"action"`          // mark_done (mark_cancelled) | retry | mark_failed
	SeenUpdatedAt time.Time `json:"seen_updated_at"` // the operation's updated_at as the admin saw it
	TruthSeen     string    `json:"truth_seen"`      // the truth now the admin saw (optional; UNKNOWN when absent)
	Note          string    `json:"note"`
}

// handleResolveAPI: POST /api/v1/admin/operations/:id/resolve (admin,
// Idempotency-Key). 200 with the operation · 409 state-changed when it is
// no longer as seen · 422 when the evidence rules the decision out.
func (app *App) handleResolveAPI(c echo.Context) error {
	var in resolveBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	return app.resolve(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		if refusal != nil {
			return problemAnswer(c, refusal)
		}
		return idempotency.JSONResponse(http.StatusOK, op)
	})
}

// handleResolveForm: POST /reconciliation/:id/resolve (admin form, hidden
// idempotency_key). The answer — a redirect back to the desk — is stored
// with the decision, so a double-click replays it.
func (app *App) handleResolveForm(c echo.Context) error {
	seen, err := time.Parse(time.RFC3339Nano, c.FormValue("seen_updated_at"))
	if err != nil {
		return refuse(errInvalidParameter, "Invalid form", "the form lacks the state it was shown for; reload the page")
	}
	in := resolveBody{Action: c.FormValue("action"), SeenUpdatedAt: seen, TruthSeen: c.FormValue("truth_seen"), Note: c.FormValue("note")}
	return app.resolve(c, in, func(c echo.Context, op workflow.Operation, refusal error) (idempotency.Response, error) {
		switch {
		case errors.Is(refusal, workflow.ErrStateChanged):
			// Said in words, and stored as this form's answer like any other.
			n := views.Notice{
				Title: "Someone else already resolved it",
				Message: "This operation is no longer in the state this page showed you, so your decision was not applied. " +
					"Another admin (or the recovery loop, after a retry) got there first; its timeline says what happened.",
				Back: "/reconciliation", BackLabel: "Back to reconciliation",
			}
			return pageAnswer(c, http.StatusConflict, views.NoticePage(app.page(c, n.Title, "reconciliation"), n))
		case refusal != nil:
			return app.refusalPage(c, refusal)
		}
		return redirectAnswer(deskURL(c.FormValue("return"), url.Values{
			"resolved": {strconv.FormatInt(op.ID, 10)}, "action": {c.FormValue("action")}}))
	})
}

// resolve is the one call both resolve handlers make.
func (app *App) resolve(c echo.Context, in resolveBody, answer answerer[workflow.Operation]) error {
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	req, err := app.resolveRequest(c, id, in.Action, in.SeenUpdatedAt, in.TruthSeen, in.Note)
	if err != nil {
		return err
	}
	return respond(c, answer, func(hooks workflow.Hooks[workflow.Operation]) error {
		_, err := app.desk.Resolve(c.Request().Context(), req, hooks)
		return err
	})
}

// resolveRequest checks one decision's fields; field names the prefix of
// the field in the caller's body ("" for the single decision, "decisions[3]."
// in a batch).
func (app *App) resolveRequest(c echo.Context, id int64, action string, seen time.Time, truthSeen, note string, field ...string) (reconciliation.ResolveRequest, error) {
	prefix := strings.Join(field, "")
	res, ok := reconciliation.ParseResolution(action)
	if !ok {
		return reconciliation.ResolveRequest{}, refuse(errValidation, "Invalid action",
			"action must be mark_done (or mark_cancelled), retry or mark_failed").With("field", prefix+"action")
	}
	if seen.IsZero() {
		return reconciliation.ResolveRequest{}, refuse(errValidation, "Missing state",
			"seen_updated_at must be the operation's updated_at as you saw it").With("field", prefix+"seen_updated_at")
	}
	if truthSeen != "" && !slices.Contains(truthFilters, truthSeen) {
		return reconciliation.ResolveRequest{}, refuse(errValidation, "Invalid truth_seen",
			"truth_seen must be one of "+strings.Join(truthFilters, ", ")).With("field", prefix+"truth_seen")
	}
	if err := validText("note", note, maxTextLength); err != nil {
		return reconciliation.ResolveRequest{}, err
	}
	u, _ := userFrom(c)
	return reconciliation.ResolveRequest{
		OperationID: id, Resolution: res, SeenUpdatedAt: seen, Note: note, TruthSeen: truthSeen,
		Actor: u.Name + " (admin, " + app.actor(c) + ")", DecidedBy: u.Name, Desk: app.deskConfig(),
	}, nil
}

// decisionsBody is the JSON of POST /api/v1/reconciliation/decisions.
type decisionsBody struct {
	Decisions []decisionBody `json:"decisions"`
	Note      string         `json:"note"` // for every decision without its own
}

type decisionBody struct {
	OperationID   int64     `json:"operation_id"`
	Action        string    `json:"action"`
	SeenUpdatedAt time.Time `json:"seen_updated_at"`
	TruthSeen     string    `json:"truth_seen"`
	Note          string    `json:"note"`
}

// batchAnswer is what a batch of decisions answers.
type batchAnswer struct {
	Decided  int                      `json:"decided"`
	Changed  int                      `json:"state_changed"`
	Refused  int                      `json:"not_allowed"`
	NotFound int                      `json:"not_found"`
	Results  []reconciliation.Decided `json:"results"`
}

func countBatch(results []reconciliation.Decided) batchAnswer {
	a := batchAnswer{Results: results}
	for _, r := range results {
		switch r.Outcome {
		case reconciliation.OutcomeDecided:
			a.Decided++
		case reconciliation.OutcomeStateChanged:
			a.Changed++
		case reconciliation.OutcomeNotAllowed:
			a.Refused++
		default:
			a.NotFound++
		}
	}
	return a
}

// handleDecisionsPostAPI: POST /api/v1/reconciliation/decisions (admin,
// Idempotency-Key) — bulk decisions, each conditional on the state its
// person saw and applied only where the truth now makes it unambiguous.
// 200 with every item's outcome, in one commit.
func (app *App) handleDecisionsPostAPI(c echo.Context) error {
	var in decisionsBody
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err
	}
	if len(in.Decisions) == 0 || len(in.Decisions) > maxBatch {
		return refuse(errValidation, "Invalid decisions",
			fmt.Sprintf("decisions must hold from 1 to %d decisions", maxBatch)).With("field", "decisions")
	}
	if err := validText("note", in.Note, maxTextLength); err != nil {
		return err
	}
	reqs := make([]reconciliation.ResolveRequest, len(in.Decisions))
	for i, d := range in.Decisions {
		prefix := fmt.Sprintf("decisions[%d].", i)
		if d.OperationID <= 0 {
			return refuse(errValidation, "Invalid operation_id",
				"operation_id must be a positive whole number").With("field", prefix+"operation_id")
		}
		if err := validText(prefix+"note", d.Note, maxTextLength); err != nil {
			return err
		}
		req, err := app.resolveRequest(c, d.OperationID, d.Action, d.SeenUpdatedAt, d.TruthSeen, cmp.Or(d.Note, in.Note), prefix)
		if err != nil {
			return err
		}
		req.OnlyIfSuggested = true
		reqs[i] = req
	}
	return app.decideMany(c, reqs, func(c echo.Context, results []reconciliation.Decided, _ error) (idempotency.Response, error) {
		return idempotency.JSONResponse(http.StatusOK, countBatch(results))
	})
}

// handleDecideForm: POST /reconciliation/decide (admin, keyed form) — the
// desk's bulk button: one action for every item posted as
// "id|seen_updated_at|truth". The stored answer is the redirect, so a
// double-click decides once.
func (app *App) handleDecideForm(c echo.Context) error {
	form, err := c.FormParams()
	if err != nil {
		return err
	}
	items := form["item"]
	if len(items) == 0 || len(items) > maxBatch {
		return refuse(errValidation, "Invalid form",
			fmt.Sprintf("a bulk decision names from 1 to %d items", maxBatch)).With("field", "item")
	}
	note := c.FormValue("note")
	reqs := make([]reconciliation.ResolveRequest, 0, len(items))
	for _, it := range items {
		parts := strings.Split(it, "|")
		var id int64
		var seen time.Time
		if len(parts) == 3 {
			id, err = parseID(parts[0])
			if err == nil {
				seen, err = time.Parse(time.RFC3339Nano, parts[1])
			}
		}
		if len(parts) != 3 || err != nil {
			return refuse(errValidation, "Invalid form",
				"every item must be id|seen_updated_at|truth as the desk rendered it; reload the page").With("field", "item")
		}
		req, err := app.resolveRequest(c, id, c.FormValue("action"), seen, parts[2], note)
		if err != nil {
			return err
		}
		req.OnlyIfSuggested = true
		reqs = append(reqs, req)
	}
	return app.decideMany(c, reqs, func(c echo.Context, results []reconciliation.Decided, _ error) (idempotency.Response, error) {
		a := countBatch(results)
		return redirectAnswer(deskURL(c.FormValue("return"), url.Values{
			"decided": {strconv.Itoa(a.Decided)}, "changed": {strconv.Itoa(a.Changed)},
			"refused": {strconv.Itoa(a.Refused + a.NotFound)}}))
	})
}

// decideMany is the one call both bulk handlers make.
func (app *App) decideMany(c echo.Context, reqs []reconciliation.ResolveRequest, answer answerer[[]reconciliation.Decided]) error {
	return respond(c, answer, func(hooks workflow.Hooks[[]reconciliation.Decided]) error {
		_, err := app.desk.ResolveMany(c.Request().Context(), reqs, hooks)
		return err
	})
}
