package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/users"
)

// A browser is signed in by a session cookie naming a row of the sessions
// table (users.Store.StartSession): signing out deletes the row, so the
// cookie stops working on every replica at once, and signing in always
// starts a new session under a new id.
//
// Every form carries a CSRF token bound to that session: an HMAC, under the
// server secret, of the session id. Another session's token — bob's, pasted
// into alice's browser by an attacker — does not match. A browser not
// signed in yet (the sign-in form) is bound the same way to a random
// pre-session cookie.
//
// Over HTTPS (TLS, or a trusted proxy's X-Forwarded-Proto) the cookies are
// Secure and named with the __Host- prefix, which browsers accept only
// from a secure origin, for Path=/ and without Domain: no subdomain and no
// plain-HTTP page can plant or overwrite them.

const (
	sessionCookie = "idemlab_session"
	csrfCookie    = "idemlab_csrf"
	sessionTTL    = 12 * time.Hour

	csrfField  = "_csrf"        // the hidden form field
	csrfHeader = "X-CSRF-Token" // htmx sends it as a header (layout.templ)
)

const (
	sessionIDKey = "session_id" // the request's session id, for sign-out and CSRF
	csrfTokenKey = "csrf_token" // the token this request's pages embed
)

// secure reports whether this request came over HTTPS, as far as this
// server can trust: TLS to it, or X-Forwarded-Proto from TRUSTED_PROXIES.
func secure(c echo.Context) bool { return c.Scheme() == "https" }

// cookieName is base, with the __Host- prefix over HTTPS.
func cookieName(c echo.Context, base string) string {
	if secure(c) {
		return "__Host-" + base
	}
	return base
}

// setCookie sets one of the app's cookies with the attributes they all
// share: Path=/, HttpOnly, Secure over HTTPS, no Domain.
func setCookie(c echo.Context, base, value string, expires time.Time, sameSite http.SameSite) {
	ck := &http.Cookie{
		Name: cookieName(c, base), Value: value, Path: "/",
		HttpOnly: true, Secure: secure(c), SameSite: sameSite,
	}
	switch {
	case value == "":
		ck.MaxAge = -1 // delete it
	case !expires.IsZero():
		ck.Expires = expires
	}
	c.SetCookie(ck)
}

func cookieValue(c echo.Context, base string) string {
	ck, err := c.Cookie(cookieName(c, base))
	if err != nil {
		return ""
	}
	return ck.Value
}

// loadSession reads the session cookie of a browser request and, when its
// session is live, puts the user in the context. It never refuses: pages
// decide with requireSignIn whether they need a user.
func (app *App) loadSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if id := cookieValue(c, sessionCookie); id != "" {
			u, err := app.users.BySession(c.Request().Context(), id)
			switch {
			case err == nil:
				c.Set(userKey, u)
				c.Set(sessionIDKey, id)
			case !errors.Is(err, users.ErrNotFound):
				return err
			}
		}
		return next(c)
	}
}

// signIn starts a new session for u (ending the one this browser had, if
// any) and sets its cookie.
func (app *App) signIn(c echo.Context, u users.User) error {
	ctx := c.Request().Context()
	if old, ok := c.Get(sessionIDKey).(string); ok && old != "" {
		if err := app.users.EndSession(ctx, old); err != nil {
			return err
		}
	}
	s, err := app.users.StartSession(ctx, u, sessionTTL)
	if err != nil {
		return err
	}
	// Lax: sent on top-level navigation to the app, not on cross-site posts.
	setCookie(c, sessionCookie, s.ID, s.Expires, http.SameSiteLaxMode)
	return nil
}

// signOut ends this browser's session on the server and clears its cookie.
func (app *App) signOut(c echo.Context) error {
	if id, ok := c.Get(sessionIDKey).(string); ok {
		if err := app.users.EndSession(c.Request().Context(), id); err != nil {
			return err
		}
	}
	setCookie(c, sessionCookie, "", time.Time{}, http.SameSiteLaxMode)
	return nil
}

// csrfProtection guards every cookie-authenticated form. It runs after
// loadSession. A safe method gets the token its page should embed (and a
// pre-session cookie when the browser has neither); an unsafe one must send
// that token back, as the _csrf field or the X-CSRF-Token header, or it is
// refused 403 whatever the reason.
func (app *App) csrfProtection(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		binding, _ := c.Get(sessionIDKey).(string)
		if binding == "" {
			binding = cookieValue(c, csrfCookie)
		}
		switch c.Request().Method {
		case http.MethodGet, http.MethodHead:
			if binding == "" {
				binding = newPreSession()
				// Strict: the sign-in form is only ever posted from this site.
				setCookie(c, csrfCookie, binding, time.Time{}, http.SameSiteStrictMode)
			}
			c.Set(csrfTokenKey, app.csrfTokenFor(binding))
			return next(c)
		}
		sent := c.Request().Header.Get(csrfHeader)
		if sent == "" {
			sent = c.FormValue(csrfField)
		}
		if binding == "" || !hmac.Equal([]byte(sent), []byte(app.csrfTokenFor(binding))) {
			return refuse(errCSRF, "Form expired or forged",
				"the form's CSRF token is missing or wrong; reload the page and try again")
		}
		c.Set(csrfTokenKey, app.csrfTokenFor(binding))
		return next(c)
	}
}

// sessionForErrorPage gives an error raised before the page middleware ran
// — no such route, a method the path lacks — the session it would have had,
// so the error page's header shows who is signed in (and a working Sign
// out) instead of "Sign in". It sets no cookie and refuses nothing.
func (app *App) sessionForErrorPage(c echo.Context) {
	if _, ok := c.Get(csrfTokenKey).(string); ok {
		return // the page middleware ran
	}
	binding := cookieValue(c, csrfCookie)
	if id := cookieValue(c, sessionCookie); id != "" {
		if u, err := app.users.BySession(c.Request().Context(), id); err == nil {
			c.Set(userKey, u)
			c.Set(sessionIDKey, id)
			binding = id
		}
	}
	if binding != "" {
		c.Set(csrfTokenKey, app.csrfTokenFor(binding))
	}
}

// csrfTokenFor is the token bound to a session id or pre-session value:
// HMAC-SHA256 under the server secret, so it cannot be computed without
// the secret nor moved to another session.
func (app *App) csrfTokenFor(binding string) string {
	m := hmac.New(sha256.New, app.secret)
	m.Write([]byte("csrf\x00"))
	m.Write([]byte(binding))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func newPreSession() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// csrfToken is the token this request's page embeds in its forms.
func csrfToken(c echo.Context) string {
	t, _ := c.Get(csrfTokenKey).(string)
	return t
}
