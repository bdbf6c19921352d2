package web

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/labs"
	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/workflow"
	"github.com/idemlab/idemlab/views"
)

// handleLabsPage: GET /labs — the list of labs.
func (app *App) handleLabsPage(c echo.Context) error {
	var list []views.LabSummary
	for _, l := range labs.All() {
		list = append(list, views.LabSummary{Number: l.Number, Name: l.Name, Title: l.Title, Summary: l.Summary, URL: "/labs/" + l.Name, Needs: l.Needs})
	}
	return render(c, http.StatusOK, views.LabsPage(app.page(c, "Labs", "labs"), list))
}

// handleRaceLabPage: GET /labs/race — the race lab's form.
func (app *App) handleRaceLabPage(c echo.Context) error {
	lab, err := app.raceLab(c, views.RaceForm{Slot: "fresh", Racers: 16, Strategy: string(labs.ConditionalUpdate), ThinkMS: 50})
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RaceLabPage(app.page(c, "Race lab", "labs"), lab))
}

// handleRunRace: POST /labs/race — runs one race on the server (the work is
// labs.RaceLab.Race) and shows the result: the result panel for htmx, the
// whole page otherwise. Not under the idempotency protocol: every run is a
// new experiment, and running one twice harms nothing.
func (app *App) handleRunRace(c echo.Context) error {
	form := views.RaceForm{Slot: c.FormValue("slot"), Strategy: c.FormValue("strategy")}
	req, problem := parseRace(c, &form)
	var outcome *views.RaceOutcome
	if problem == "" {
		res, err := app.lab.Race(c.Request().Context(), req)
		switch {
		case errors.Is(err, slots.ErrNotFound):
			problem = "Slot (slot): that is not one of the lab's slots; pick a fresh slot or one listed."
		case errors.Is(err, labs.ErrInvalidRace), errors.Is(err, labs.ErrUnknownStrategy):
			problem = publicDetail(err)
		case err != nil:
			return err
		default:
			outcome = raceOutcome(res)
		}
	}
	lab, err := app.raceLab(c, form) // after the race, so a fresh slot is listed
	if err != nil {
		return err
	}
	lab.Result, lab.Error = outcome, problem
	status := http.StatusOK
	if problem != "" {
		status = http.StatusUnprocessableEntity
	}
	if c.Request().Header.Get("HX-Request") == "true" {
		// htmx swaps 2xx answers only; the panel explains a refusal itself.
		return render(c, http.StatusOK, views.RaceResultPanel(lab))
	}
	return render(c, status, views.RaceLabPage(app.page(c, "Race lab", "labs"), lab))
}

// parseRace reads the form into a request, or says what is wrong with it.
func parseRace(c echo.Context, form *views.RaceForm) (labs.RaceRequest, string) {
	var req labs.RaceRequest
	var err error
	// Bounds are checked on the numbers as typed, before any arithmetic:
	// 18446744073710 ms would overflow a time.Duration into something small.
	form.Racers, err = strconv.Atoi(c.FormValue("racers"))
	if err != nil || form.Racers < labs.MinRacers || form.Racers > labs.MaxRacers {
		return req, fmt.Sprintf("Racers (racers): the number of competing users must be a whole number from %d to %d.", labs.MinRacers, labs.MaxRacers)
	}
	form.ThinkMS, err = strconv.Atoi(c.FormValue("think_ms"))
	if err != nil || form.ThinkMS < 0 || form.ThinkMS > int(labs.MaxThink.Milliseconds()) {
		return req, fmt.Sprintf("Think time (think_ms): a whole number of milliseconds from 0 to %d.", labs.MaxThink.Milliseconds())
	}
	req.Racers, req.Think = form.Racers, time.Duration(form.ThinkMS)*time.Millisecond
	if req.Strategy, err = labs.ParseStrategy(form.Strategy); err != nil {
		return req, "Strategy (strategy): pick conditional-update, select-for-update or check-then-insert."
	}
	if form.Slot == "" {
		form.Slot = "fresh"
	}
	if form.Slot != "fresh" {
		if req.SlotID, err = strconv.ParseInt(form.Slot, 10, 64); err != nil || req.SlotID <= 0 {
			return req, "Slot (slot): pick a fresh slot or one of the lab's slots."
		}
	}
	return req, ""
}

// raceLab fills the lab's view model around form.
func (app *App) raceLab(c echo.Context, form views.RaceForm) (views.RaceLab, error) {
	lab := views.RaceLab{Form: form, CSRF: csrfToken(c)}
	for _, s := range labs.Strategies {
		lab.Strategies = append(lab.Strategies, views.StrategyChoice{Value: string(s), Help: strategyHelp[s]})
	}
	recent, err := app.lab.RecentLabSlots(c.Request().Context(), 10)
	if err != nil {
		return lab, err
	}
	for _, s := range recent {
		lab.LabSlots = append(lab.LabSlots, views.LabSlotChoice{
			ID: s.ID, Label: fmt.Sprintf("#%d · %s · %s", s.ID, s.StartsAt.UTC().Format("Mon 2 Jan 15:04"), s.Status),
		})
	}
	return lab, nil
}

var strategyHelp = map[labs.Strategy]string{
	labs.ConditionalUpdate: "one UPDATE … WHERE status = 'AVAILABLE': the row lock orders the racers, losers update 0 rows. The default.",
	labs.SelectForUpdate:   "lock the row (SELECT … FOR UPDATE), look, then write: racers queue on the lock.",
	labs.CheckThenInsert:   "read without a lock, then insert: the naive way. Only the unique index stops a double booking.",
}

// raceOutcome turns a race's result into the panel's view model.
func raceOutcome(res labs.RaceResult) *views.RaceOutcome {
	o := &views.RaceOutcome{
		SlotID: res.Slot.ID, SlotName: slotName(res.Slot), SlotState: res.Slot.Status,
		Strategy: string(res.Request.Strategy), Racers: res.Request.Racers, ThinkMS: int(res.Request.Think.Milliseconds()),
		Verdict: res.Verdict(), Healthy: res.Won <= 1 && res.Failed == 0 && len(res.Violations) == 0,
		Won: res.Won, Refused: res.Refused, Failed: res.Failed, ConstraintHits: res.ConstraintHits,
		Elapsed: millis(res.Elapsed),
		Next:    views.RaceForm{Racers: res.Request.Racers, Strategy: string(res.Request.Strategy), ThinkMS: int(res.Request.Think.Milliseconds())},
	}
	if res.Slot.BookingID != nil {
		o.SlotState += fmt.Sprintf(", held by booking #%d", *res.Slot.BookingID)
	}
	var longest time.Duration
	for _, a := range res.Attempts {
		longest = max(longest, a.Trace.Waited)
	}
	o.LongestWait = millis(longest)
	for _, a := range res.Attempts {
		row := views.RaceAttempt{
			Finished: a.Finished, User: a.User, Outcome: a.Outcome, Waited: millis(a.Trace.Waited), Took: millis(a.Took),
			RowsUpdated: a.Trace.RowsUpdated, ConstraintHit: a.Trace.ConstraintHit, BookingID: a.BookingID, Error: a.Error,
		}
		if longest > 0 {
			row.WaitedPercent = int(100 * a.Trace.Waited / longest)
		}
		o.Attempts = append(o.Attempts, row)
	}
	for _, v := range res.Violations {
		o.Violations = append(o.Violations, v.String())
	}
	return o
}

// millis shows a duration in milliseconds with one decimal: "12.3 ms".
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
}

// The numbered labs (internal/labs): each page explains the lab and runs it
// — keyed, so a double-click runs it once — and shows the result; the API
// does the same in JSON. A run is one workflow (labs.Labs.Run) whose one
// commit holds the key's claim, the result and the stored answer.

// handleListLabsAPI: GET /api/v1/labs — every lab, what it teaches, the
// counts it reports and the lines of code it is about.
func (app *App) handleListLabsAPI(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]any{"labs": labs.All()})
}

// handleRunLabAPI: POST /api/v1/labs/:name/runs (Idempotency-Key). 201 the
// run, Location its URL · 404 no such lab · 503 lab-unavailable.
func (app *App) handleRunLabAPI(c echo.Context) error {
	var in struct{}
	if err := decodeOptionalJSON(c, &in); err != nil {
		return err // refused before the workflow: nothing claimed, nothing stored
	}
	return app.runLab(c, func(c echo.Context, r labs.Run, _ error) (idempotency.Response, error) {
		resp, err := idempotency.JSONResponse(http.StatusCreated, r)
		resp.Header.Set(echo.HeaderLocation, "/api/v1"+labRunPath(r))
		return resp, err
	})
}

// handleRunLabForm: POST /labs/:name/runs (form, hidden idempotency_key):
// the run, then a redirect to its page, stored with the key.
func (app *App) handleRunLabForm(c echo.Context) error {
	return app.runLab(c, func(c echo.Context, r labs.Run, _ error) (idempotency.Response, error) {
		return redirectAnswer(labRunPath(r))
	})
}

// runLab is the one call both run handlers make.
func (app *App) runLab(c echo.Context, answer answerer[labs.Run]) error {
	name, err := app.runnableLab(c)
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	return respond(c, answer, func(hooks workflow.Hooks[labs.Run]) error {
		_, err := app.labs.Run(c.Request().Context(), labs.RunRequest{Lab: name, UserID: u.ID}, hooks)
		return err
	})
}

// runnableLab is the :name of the path, known and with the labs running here.
func (app *App) runnableLab(c echo.Context) (string, error) {
	name := c.Param("name")
	if _, ok := labs.Find(name); !ok {
		return "", labs.ErrUnknownLab
	}
	if app.labs == nil {
		return "", labs.ErrUnavailable
	}
	return name, nil
}

func labRunPath(r labs.Run) string { return fmt.Sprintf("/labs/%s/runs/%d", r.Lab, r.ID) }

// labRunJSON is a run as GET …/runs/:id answers it: for the timeout lab,
// with its operations as they are now.
type labRunJSON struct {
	labs.Run
	Live []labOperationJSON `json:"live,omitempty"`
}

type labOperationJSON struct {
	Mode string `json:"mode"`
	operationView
	// ProviderEffects is what the provider really did for the policy.
	ProviderEffects int64 `json:"provider_effects"`
}

// handleListLabRunsAPI: GET /api/v1/labs/:name/runs — the caller's newest runs.
func (app *App) handleListLabRunsAPI(c echo.Context) error {
	name, err := app.runnableLab(c)
	if err != nil {
		return err
	}
	u, _ := userFrom(c)
	runs, err := app.labs.Latest(c.Request().Context(), name, u.ID, labsRecent)
	if err != nil {
		return err
	}
	if runs == nil {
		runs = []labs.Run{}
	}
	return c.JSON(http.StatusOK, map[string]any{"runs": runs})
}

// labsRecent is how many earlier runs a page lists.
const labsRecent = 10

// handleGetLabRunAPI: GET /api/v1/labs/:name/runs/:id — one run (the
// caller's; an admin may read any).
func (app *App) handleGetLabRunAPI(c echo.Context) error {
	r, err := app.labRun(c)
	if err != nil {
		return err
	}
	out := labRunJSON{Run: r}
	cards, err := app.labOperations(c, r)
	if err != nil {
		return err
	}
	for _, card := range cards {
		out.Live = append(out.Live, labOperationJSON{Mode: card.mode, operationView: card.view, ProviderEffects: card.effects})
	}
	return c.JSON(http.StatusOK, out)
}

// labRun reads the run the path names.
func (app *App) labRun(c echo.Context) (labs.Run, error) {
	name := c.Param("name")
	if _, ok := labs.Find(name); !ok {
		return labs.Run{}, labs.ErrUnknownLab
	}
	id, err := pathID(c, "id")
	if err != nil {
		return labs.Run{}, err
	}
	if app.labs == nil {
		return labs.Run{}, labs.ErrUnavailable
	}
	u, _ := userFrom(c)
	return app.labs.Get(c.Request().Context(), name, id, u.ID, u.IsAdmin())
}

// handleLabPage: GET /labs/:name — the lab, its Run button, the caller's
// latest run.
func (app *App) handleLabPage(c echo.Context) error {
	return app.renderLabPage(c, nil)
}

// handleLabRunPage: GET /labs/:name/runs/:id — the lab with that run.
func (app *App) handleLabRunPage(c echo.Context) error {
	r, err := app.labRun(c)
	if err != nil {
		return err
	}
	return app.renderLabPage(c, &r)
}

// handleLabOperationsPanel: GET /labs/:name/runs/:id/operations — the
// timeout lab's operations, the htmx partial that refreshes itself.
func (app *App) handleLabOperationsPanel(c echo.Context) error {
	r, err := app.labRun(c)
	if err != nil {
		return err
	}
	ops, err := app.labOperationsView(c, r)
	if err != nil {
		return err
	}
	if ops == nil {
		return labs.ErrRunNotFound // a lab without operations has no such panel
	}
	return render(c, http.StatusOK, views.LabOperationsPanel(*ops))
}

func (app *App) renderLabPage(c echo.Context, run *labs.Run) error {
	lab, ok := labs.Find(c.Param("name"))
	if !ok {
		return labs.ErrUnknownLab
	}
	v := views.LabPageView{Lab: labInfo(lab), RunKey: newFormKey(), CSRF: csrfToken(c)}
	if app.labs != nil {
		v.Unavailable = app.labs.Unavailable(lab.Name)
		u, _ := userFrom(c)
		recent, err := app.labs.Latest(c.Request().Context(), lab.Name, u.ID, labsRecent)
		if err != nil {
			return err
		}
		if run == nil && len(recent) > 0 {
			run = &recent[0]
		}
		for _, r := range recent {
			v.Recent = append(v.Recent, views.LabRunLink{URL: labRunPath(r),
				Label: fmt.Sprintf("Run #%d, %s", r.ID, r.StartedAt.UTC().Format("Mon 2 Jan 15:04:05 MST"))})
		}
	}
	if run != nil {
		rv, err := app.labRunView(c, lab, *run)
		if err != nil {
			return err
		}
		v.Run = &rv
	}
	return render(c, http.StatusOK, views.LabPage(app.page(c, lab.Title, "labs"), v))
}

// labInfo is what the page shows of a lab.
func labInfo(lab labs.Lab) views.LabInfo {
	info := views.LabInfo{Number: lab.Number, Name: lab.Name, Title: lab.Title, Summary: lab.Summary, Lesson: lab.Lesson, RunHint: lab.RunHint, Try: lab.Try}
	for _, col := range lab.Columns {
		info.Columns = append(info.Columns, views.LabColumn{Label: col.Label, Bad: col.Bad})
	}
	for _, ref := range lab.Code {
		info.Code = append(info.Code, views.LabCode{Where: fmt.Sprintf("%s:%d", ref.Path, ref.Line), Href: CodeHref(ref.Path, ref.Line),
			Text: ref.Text, Says: ref.Says})
	}
	return info
}

// labRunView turns a run into the result's view model.
func (app *App) labRunView(c echo.Context, lab labs.Lab, r labs.Run) (views.LabRunView, error) {
	v := views.LabRunView{ID: r.ID, Lab: r.Lab, Started: r.StartedAt.UTC().Format("Mon 2 Jan 15:04:05 MST"),
		Took: millis(r.FinishedAt.Sub(r.StartedAt))}
	for _, vr := range r.Variants {
		v.Compare = v.Compare || vr.Broken
		lv := views.LabVariant{Name: vr.Name, Title: vr.Title, Broken: vr.Broken, Held: vr.Held, Verdict: vr.Verdict, NotRun: vr.NotRun}
		for _, col := range lab.Columns {
			n := vr.Counts[col.Key]
			lv.Counts = append(lv.Counts, views.LabCount{Value: n, Bad: col.Bad && n > 0})
		}
		for _, e := range vr.Timeline {
			lv.Timeline = append(lv.Timeline, views.LabEvent{At: "+" + strconv.FormatFloat(e.AtMS, 'f', 1, 64) + " ms",
				Actor: e.Actor, What: e.What, Bad: e.Bad})
		}
		v.Variants = append(v.Variants, lv)
	}
	ops, err := app.labOperationsView(c, r)
	v.Operations = ops
	return v, err
}

// labOperation is one of the timeout lab's operations as it is now.
type labOperation struct {
	mode    string
	view    operationView
	effects int64
}

// labOperations reads the run's operations (the timeout lab's), whoever
// owns them: they are the lab's, and the run is the caller's. What the
// provider did comes from its ledger.
func (app *App) labOperations(c echo.Context, r labs.Run) ([]labOperation, error) {
	if len(r.Operations) == 0 || app.engine == nil {
		return nil, nil
	}
	ctx := c.Request().Context()
	u, _ := userFrom(c)
	byPolicy := map[int64]int64{}
	if app.providerControl != nil {
		if e, err := app.providerControl.Effects(ctx); err == nil {
			for _, pe := range e.ByPolicy {
				byPolicy[pe.PolicyID] = pe.Count + pe.Pending
			}
		}
	}
	var out []labOperation
	for i, id := range r.Operations {
		op, err := app.engine.GetOperation(ctx, id, 0, true)
		if err != nil {
			return nil, err
		}
		view, err := app.viewOperation(ctx, op, u.IsAdmin())
		if err != nil {
			return nil, err
		}
		mode := ""
		if i < len(r.Variants) {
			mode = r.Variants[i].Name
		}
		out = append(out, labOperation{mode: mode, view: view, effects: byPolicy[op.PolicyID]})
	}
	return out, nil
}

// labOperationsView is labOperations as the page's cards.
func (app *App) labOperationsView(c echo.Context, r labs.Run) (*views.LabOperations, error) {
	ops, err := app.labOperations(c, r)
	if err != nil || len(ops) == 0 {
		return nil, err
	}
	v := &views.LabOperations{PanelURL: labRunPath(r) + "/operations"}
	u, _ := userFrom(c)
	for _, o := range ops {
		detail, err := app.operationDetail(c.Request().Context(), o.view, u.IsAdmin())
		if err != nil {
			return nil, err
		}
		v.Live = v.Live || !detail.Terminal
		v.Cards = append(v.Cards, views.LabOperationCard{Mode: o.mode, Op: detail, Effects: o.effects})
	}
	return v, nil
}
