package main

import (
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/views"
)

// handleListSlots: GET /api/v1/slots?status=&limit=&cursor=
func (app *application) handleListSlots(c echo.Context) error {
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && status != slots.StatusAvailable && status != slots.StatusBooked {
		return invalidParam("status", "status must be AVAILABLE or BOOKED")
	}
	rows, err := app.slots.List(c.Request().Context(), slots.ListFilter{Status: status, AfterID: lp.AfterID, Limit: lp.Limit + 1})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newListPage(rows, lp.Limit, func(s slots.Slot) int64 { return s.ID }))
}

func (app *application) handleSlotsPage(c echo.Context) error {
	var all []slots.Slot
	for after := int64(0); ; {
		batch, err := app.slots.List(c.Request().Context(), slots.ListFilter{AfterID: after, Limit: maxLimit})
		if err != nil {
			return err
		}
		all = append(all, batch...)
		if len(batch) < maxLimit {
			break
		}
		after = batch[len(batch)-1].ID
	}
	return render(c, http.StatusOK, views.SlotsPage(app.page(c, "Slots", "slots"), slotGrids(all)))
}

// slotGrids arranges slots as one grid per resource: hours down, days across.
func slotGrids(list []slots.Slot) []views.SlotGrid {
	type cellKey struct{ day, hour string }
	var order []string
	byRes := map[string]map[cellKey]*views.SlotCell{}
	daySet, hourSet := map[string]bool{}, map[string]bool{}
	var days, hours []string
	for _, s := range list {
		if byRes[s.Resource] == nil {
			byRes[s.Resource] = map[cellKey]*views.SlotCell{}
			order = append(order, s.Resource)
		}
		d, h := s.StartsAt.UTC().Format("Mon 2 Jan"), s.StartsAt.UTC().Format("15:04")
		if !daySet[d] {
			daySet[d] = true
			days = append(days, d)
		}
		if !hourSet[h] {
			hourSet[h] = true
			hours = append(hours, h)
		}
		byRes[s.Resource][cellKey{d, h}] = &views.SlotCell{ID: s.ID, Status: s.Status}
	}
	slices.Sort(hours)
	grids := make([]views.SlotGrid, 0, len(order))
	for _, r := range order {
		g := views.SlotGrid{Resource: r, Days: days, Hours: hours, Cells: make([][]*views.SlotCell, len(hours))}
		for i, h := range hours {
			g.Cells[i] = make([]*views.SlotCell, len(days))
			for j, d := range days {
				g.Cells[i][j] = byRes[r][cellKey{d, h}]
			}
		}
		grids = append(grids, g)
	}
	return grids
}
