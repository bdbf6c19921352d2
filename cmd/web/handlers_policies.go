package main

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/policies"
	"github.com/idemlab/idemlab/views"
)

// handleListPolicies: GET /api/v1/policies?status=&limit=&cursor=
func (app *application) handleListPolicies(c echo.Context) error {
	u, _ := userFrom(c)
	lp, err := parseListParams(c)
	if err != nil {
		return err
	}
	status := c.QueryParam("status")
	if status != "" && status != policies.StatusActive && status != policies.StatusCancelled {
		return invalidParam("status", "status must be ACTIVE or CANCELLED")
	}
	rows, err := app.policies.List(c.Request().Context(), policies.ListFilter{
		UserID: u.ID, Status: status, AfterID: lp.AfterID, Limit: lp.Limit + 1,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newListPage(rows, lp.Limit, func(p policies.Policy) int64 { return p.ID }))
}

// handleGetPolicy: GET /api/v1/policies/:id — 404 for another customer's.
func (app *application) handleGetPolicy(c echo.Context) error {
	u, _ := userFrom(c)
	id, err := pathID(c, "id")
	if err != nil {
		return err
	}
	p, err := app.policies.Get(c.Request().Context(), u.ID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

func (app *application) handlePoliciesPage(c echo.Context) error {
	u, _ := userFrom(c)
	list, err := app.policies.List(c.Request().Context(), policies.ListFilter{UserID: u.ID, Limit: maxLimit})
	if err != nil {
		return err
	}
	rows := make([]views.PolicyRow, len(list))
	for i, p := range list {
		rows[i] = views.PolicyRow{ID: p.ID, Number: p.Number, Holder: p.Holder, Premium: p.Premium, Status: p.Status}
	}
	return render(c, http.StatusOK, views.PoliciesPage(app.page(c, "Policies", "policies"), rows))
}
