package web

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/views"
)

// handleLabsPage: GET /labs — the list of labs.
func (app *App) handleLabsPage(c echo.Context) error {
	return render(c, http.StatusOK, views.LabsPage(app.page(c, "Labs", "labs")))
}

// handleRaceLabPage: GET /labs/race — the race lab's form.
func (app *App) handleRaceLabPage(c echo.Context) error {
	lab, err := app.raceLab(c, views.RaceForm{Slot: "fresh", Racers: 16, Strategy: string(app.cfg.BookingStrategy), ThinkMS: 50})
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.RaceLabPage(app.page(c, "Race lab", "labs"), lab))
}

// handleRunRace: POST /labs/race — runs one race on the server (the work is
// slots.Lab.Race) and shows the result: the result panel for htmx, the
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
		case errors.Is(err, slots.ErrInvalidRace), errors.Is(err, slots.ErrUnknownStrategy):
			problem = strings.TrimPrefix(err.Error(), "slots: ")
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
func parseRace(c echo.Context, form *views.RaceForm) (slots.RaceRequest, string) {
	var req slots.RaceRequest
	var err error
	// Bounds are checked on the numbers as typed, before any arithmetic:
	// 18446744073710 ms would overflow a time.Duration into something small.
	form.Racers, err = strconv.Atoi(c.FormValue("racers"))
	if err != nil || form.Racers < slots.MinRacers || form.Racers > slots.MaxRacers {
		return req, fmt.Sprintf("Racers (racers): the number of competing users must be a whole number from %d to %d.", slots.MinRacers, slots.MaxRacers)
	}
	form.ThinkMS, err = strconv.Atoi(c.FormValue("think_ms"))
	if err != nil || form.ThinkMS < 0 || form.ThinkMS > int(slots.MaxThink.Milliseconds()) {
		return req, fmt.Sprintf("Think time (think_ms): a whole number of milliseconds from 0 to %d.", slots.MaxThink.Milliseconds())
	}
	req.Racers, req.Think = form.Racers, time.Duration(form.ThinkMS)*time.Millisecond
	if req.Strategy, err = slots.ParseStrategy(form.Strategy); err != nil {
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
	for _, s := range slots.Strategies {
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

var strategyHelp = map[slots.Strategy]string{
	slots.ConditionalUpdate: "one UPDATE … WHERE status = 'AVAILABLE': the row lock orders the racers, losers update 0 rows. The default.",
	slots.SelectForUpdate:   "lock the row (SELECT … FOR UPDATE), look, then write: racers queue on the lock.",
	slots.CheckThenInsert:   "read without a lock, then insert: the naive way. Only the unique index stops a double booking.",
}

// raceOutcome turns a race's result into the panel's view model.
func raceOutcome(res slots.RaceResult) *views.RaceOutcome {
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
