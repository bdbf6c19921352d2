package web

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/users"
)

type ctxKey int

const loggerKey ctxKey = iota

// logFrom returns the request's logger (it carries the request id), or the
// default logger outside a request.
func logFrom(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}

// logRequests gives every request a logger carrying its request id (set by
// middleware.RequestID before it) and logs one line when the request ends.
func (app *App) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		id := c.Response().Header().Get(echo.HeaderXRequestID)
		l := app.logger.With("request_id", id)
		req := c.Request()
		c.SetRequest(req.WithContext(context.WithValue(req.Context(), loggerKey, l)))
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		status := c.Response().Status
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		l.Log(req.Context(), level, "request",
			"method", req.Method, "route", c.Path(), "path", req.URL.Path,
			"status", status, "bytes", c.Response().Size, "duration", time.Since(start).Round(time.Microsecond))
		return nil
	}
}

const userKey = "user"

// userFrom returns the authenticated user; routes behind authenticateBearer
// or requireSignIn always have one.
func userFrom(c echo.Context) (users.User, bool) {
	u, ok := c.Get(userKey).(users.User)
	return u, ok
}

// authenticateBearer admits API requests with a valid bearer token. The API
// uses no cookies, so it needs no CSRF token and load-test tools just work.
func (app *App) authenticateBearer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		scheme, token, _ := strings.Cut(c.Request().Header.Get(echo.HeaderAuthorization), " ")
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			return unauthenticated(c, "send Authorization: Bearer <token>; the demo tokens are in the README")
		}
		u, err := app.users.ByToken(c.Request().Context(), strings.TrimSpace(token))
		if errors.Is(err, users.ErrNotFound) {
			return unauthenticated(c, "the bearer token is not valid")
		}
		if err != nil {
			return err
		}
		c.Set(userKey, u)
		return next(c)
	}
}

func unauthenticated(c echo.Context, detail string) error {
	c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="idemlab"`)
	return problem.New(http.StatusUnauthorized, "unauthenticated", "Authentication required", detail)
}

// loadSession reads the signed session cookie of a browser request. It
// never refuses: pages decide with requireSignIn whether they need a user.
func (app *App) loadSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ck, err := c.Cookie(sessionCookie)
		if err == nil {
			if id, ok := app.sessions.decode(ck.Value, time.Now()); ok {
				u, err := app.users.ByID(c.Request().Context(), id)
				if err != nil && !errors.Is(err, users.ErrNotFound) {
					return err
				}
				if err == nil {
					c.Set(userKey, u)
				}
			}
		}
		return next(c)
	}
}

// requireSignIn sends signed-out visitors to the sign-in page.
func requireSignIn(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if _, ok := userFrom(c); !ok {
			return c.Redirect(http.StatusSeeOther, "/signin")
		}
		return next(c)
	}
}

// requireAdmin answers 403 to customers on admin-only routes.
func requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if u, ok := userFrom(c); !ok || !u.IsAdmin() {
			return problem.New(http.StatusForbidden, "forbidden", "Admins only", "this action needs the admin account")
		}
		return next(c)
	}
}

// csrfProtection guards every cookie-authenticated form. Forms send the
// token as the hidden field _csrf, htmx as the X-CSRF-Token header. A
// missing or wrong token is 403 whatever the reason.
func csrfProtection() echo.MiddlewareFunc {
	return middleware.CSRFWithConfig(middleware.CSRFConfig{
		TokenLookup:    "form:_csrf,header:X-CSRF-Token",
		CookieName:     "idemlab_csrf",
		CookiePath:     "/",
		CookieHTTPOnly: true,
		CookieSameSite: http.SameSiteStrictMode,
		ErrorHandler: func(err error, c echo.Context) error {
			return problem.New(http.StatusForbidden, "csrf-token-invalid", "Form expired or forged",
				"the form's CSRF token is missing or wrong; reload the page and try again")
		},
	})
}

func csrfToken(c echo.Context) string {
	t, _ := c.Get(middleware.DefaultCSRFConfig.ContextKey).(string)
	return t
}

// secureHeaders sets the headers every response should carry. Scripts come
// only from this origin (htmx is vendored), so the policy can be strict.
func secureHeaders() echo.MiddlewareFunc {
	return middleware.SecureWithConfig(middleware.SecureConfig{
		XSSProtection:         "0",
		ContentTypeNosniff:    "nosniff",
		XFrameOptions:         "DENY",
		ReferrerPolicy:        "same-origin",
		ContentSecurityPolicy: "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
	})
}

// recoverPanics turns a panic into a logged 500; the client never sees a
// stack trace.
func recoverPanics() echo.MiddlewareFunc {
	return middleware.RecoverWithConfig(middleware.RecoverConfig{
		LogErrorFunc: func(c echo.Context, err error, stack []byte) error {
			logFrom(c.Request().Context()).Error("panic", "err", err, "stack", string(stack))
			return err
		},
	})
}
