package web

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/slots"
	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/views"
)

func (app *App) handleHome(c echo.Context) error {
	return render(c, http.StatusOK, views.HomePage(app.page(c, "Home", "")))
}

func (app *App) handleSignInPage(c echo.Context) error {
	list, err := app.users.List(c.Request().Context())
	if err != nil {
		return err
	}
	accounts := make([]views.Account, 0, len(list))
	for _, u := range list {
		if strings.HasPrefix(u.Name, slots.RacerPrefix) {
			continue // the race lab's users: no one signs in as them
		}
		accounts = append(accounts, views.Account{Name: u.Name, IsAdmin: u.IsAdmin()})
	}
	return render(c, http.StatusOK, views.SignInPage(app.page(c, "Sign in", ""), accounts))
}

// handleSignIn signs the browser in as a demo user: a signed, HttpOnly,
// SameSite cookie, then POST/redirect/GET to the policies.
func (app *App) handleSignIn(c echo.Context) error {
	u, err := app.users.ByName(c.Request().Context(), c.FormValue("name"))
	if errors.Is(err, users.ErrNotFound) {
		return render(c, http.StatusUnprocessableEntity,
			views.ErrorPage(app.page(c, "Sign in", ""), http.StatusUnprocessableEntity, "There is no demo user of that name."))
	}
	if err != nil {
		return err
	}
	expires := time.Now().Add(sessionTTL)
	c.SetCookie(&http.Cookie{
		Name:     sessionCookie,
		Value:    app.sessions.encode(u.ID, expires),
		Path:     "/",
		Expires:  expires,
		HttpOnly: true,
		Secure:   c.IsTLS(),
		SameSite: http.SameSiteLaxMode, // sent on top-level navigation to the app, not on cross-site posts
	})
	dest := "/policies"
	if u.IsAdmin() {
		dest = "/"
	}
	return c.Redirect(http.StatusSeeOther, dest)
}

func (app *App) handleSignOut(c echo.Context) error {
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode})
	return c.Redirect(http.StatusSeeOther, "/")
}
