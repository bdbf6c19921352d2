package web

import (
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/users"
	"github.com/idemlab/idemlab/views"
)

func (app *App) handleHome(c echo.Context) error {
	return render(c, http.StatusOK, views.HomePage(app.page(c, "Home", "")))
}

// handleRetryNotRecovery: GET /ideas/retry-is-not-recovery — the two side
// by side, each with the pages where it happens.
func (app *App) handleRetryNotRecovery(c echo.Context) error {
	return render(c, http.StatusOK, views.RetryNotRecoveryPage(app.page(c, "Retry is not recovery", "")))
}

// handleCrashWindow: GET /ideas/crash-between-effect-and-record — what is
// durable when a process dies after an external effect and before its
// record, and how to make it happen (demo mode).
func (app *App) handleCrashWindow(c echo.Context) error {
	return render(c, http.StatusOK, views.CrashWindowPage(app.page(c, "A crash between the effect and its record", ""), app.cfg.DemoMode))
}

// redirectTo answers every request with a redirect to a fixed path.
func redirectTo(path string) echo.HandlerFunc {
	return func(c echo.Context) error { return c.Redirect(http.StatusMovedPermanently, path) }
}

// handleSignInPage: GET /signin — in demo mode a button per demo account,
// otherwise a name and password form.
func (app *App) handleSignInPage(c echo.Context) error {
	v, err := app.signInView(c)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.SignInPage(app.page(c, "Sign in", ""), v))
}

func (app *App) signInView(c echo.Context) (views.SignIn, error) {
	v := views.SignIn{Demo: app.cfg.DemoMode}
	if !v.Demo {
		return v, nil
	}
	list, err := app.users.List(c.Request().Context())
	if err != nil {
		return v, err
	}
	for _, u := range list {
		v.Accounts = append(v.Accounts, views.Account{Name: u.Name, IsAdmin: u.IsAdmin()})
	}
	return v, nil
}

// maxNameLength bounds the name typed into the sign-in form.
const maxNameLength = 64

// handleSignIn: POST /signin — in demo mode the name alone signs in ("sign
// in as"); otherwise the name and its password (bcrypt, users.ByPassword).
// Either way a new server-side session starts (session.go), then
// POST/redirect/GET. A failure is the sign-in page again with a message;
// it never says whether the name exists.
func (app *App) handleSignIn(c echo.Context) error {
	name := c.FormValue("name")
	if err := validText("name", name, maxNameLength); err != nil {
		return app.signInRefused(c, http.StatusUnprocessableEntity, name,
			"A name is at most 64 characters of text, without control characters.")
	}
	ctx := c.Request().Context()
	var (
		u   users.User
		err error
	)
	if app.cfg.DemoMode {
		u, err = app.users.ByName(ctx, name)
	} else {
		u, err = app.users.ByPassword(ctx, name, c.FormValue("password"))
	}
	switch {
	case errors.Is(err, users.ErrNotFound):
		return app.signInRefused(c, http.StatusUnprocessableEntity, "", "There is no demo user of that name.")
	case errors.Is(err, users.ErrWrongPassword):
		return app.signInRefused(c, http.StatusUnauthorized, name, "Wrong name or password.")
	case err != nil:
		return err
	}
	if err := app.signIn(c, u); err != nil {
		return err
	}
	dest := "/policies"
	if u.IsAdmin() {
		dest = "/"
	}
	if next := c.FormValue("next"); returnable(next) {
		dest = next // the demo bar's "switch to": back to the page it was on
	}
	return c.Redirect(http.StatusSeeOther, dest)
}

// returnable reports whether a sign-in may send the browser back to path:
// a path of this site (never "//host" or a scheme, which would make the
// form an open redirect) that names no row — another user's operation
// would only answer 404.
func returnable(path string) bool {
	if len(path) > 200 || !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") ||
		strings.ContainsAny(path, "\\?#%") || path == "/signin" {
		return false
	}
	for _, seg := range strings.Split(path[1:], "/") {
		if _, err := parseID(seg); err == nil {
			return false
		}
		if !pathSegment.MatchString(seg) {
			return false
		}
	}
	return true
}

// pathSegment is what one segment of a returnable path may hold.
var pathSegment = regexp.MustCompile(`^[a-z0-9-]*$`)

func (app *App) signInRefused(c echo.Context, status int, name, msg string) error {
	v, err := app.signInView(c)
	if err != nil {
		return err
	}
	if !v.Demo {
		v.Name = name
	}
	v.Error = msg
	p := app.page(c, "Sign in", "")
	if v.Demo {
		p.Flash = msg
	}
	return render(c, status, views.SignInPage(p, v))
}

// handleSignOut: POST /signout — the session ends on the server, for every
// replica, and the cookie is cleared.
func (app *App) handleSignOut(c echo.Context) error {
	if err := app.signOut(c); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/")
}
