package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
		// An address that has sent too many bad tokens is refused before
		// its next guess is even looked up.
		exempt := app.limits.exempted(c)
		if !exempt {
			empty, wait, err := app.limits.badToken.empty(c.Request().Context(), addressKey(c))
			if err != nil {
				return err
			}
			if empty {
				return tooManyRequests(c, app.limits.badToken, wait)
			}
		}
		u, err := app.users.ByToken(c.Request().Context(), strings.TrimSpace(token))
		if errors.Is(err, users.ErrNotFound) {
			if err := app.limits.allow(c, app.limits.badToken, addressKey(c)); err != nil {
				return err
			}
			return unauthenticated(c, "the bearer token is not valid")
		}
		if err != nil {
			return err
		}
		c.Set(userKey, u)
		if err := app.limitWrites(c); err != nil {
			return err
		}
		return next(c)
	}
}

func unauthenticated(c echo.Context, detail string) error {
	c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="idemlab"`)
	return refuse(errUnauthenticated, "Authentication required", detail)
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

// limitFormWrites applies the write limits to signed-in forms.
func (app *App) limitFormWrites(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := app.limitWrites(c); err != nil {
			return err
		}
		return next(c)
	}
}

// requireAdmin answers 403 to customers on admin-only routes.
func requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if u, ok := userFrom(c); !ok || !u.IsAdmin() {
			return refuse(errForbidden, "Admins only", "this action needs the admin account")
		}
		return next(c)
	}
}

// secureHeaders sets the headers every response carries — refusals
// included, so it runs first. Scripts come only from this origin (htmx is
// vendored), so the policy can be strict. HSTS is sent only when the
// request really came over HTTPS: TLS here, or X-Forwarded-Proto from a
// proxy in TRUSTED_PROXIES (Echo's SchemeExtractor, set in routes.go).
func secureHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set(echo.HeaderXContentTypeOptions, "nosniff")
		h.Set(echo.HeaderXFrameOptions, "DENY")
		h.Set(echo.HeaderXXSSProtection, "0")
		h.Set(echo.HeaderReferrerPolicy, "same-origin")
		h.Set(echo.HeaderContentSecurityPolicy, "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
		if c.Scheme() == "https" {
			h.Set(echo.HeaderStrictTransportSecurity, "max-age=31536000")
		}
		return next(c)
	}
}

// maxRequestIDLength bounds a client's X-Request-Id.
const maxRequestIDLength = 128

// requestID gives every request an id, answered in X-Request-Id and carried
// by its log lines and the timelines it writes. A client may send its own
// (to correlate its logs with ours), but only as 1 to 128 visible ASCII
// characters: anything else — control characters, invalid UTF-8, a kilobyte
// of text — is replaced by a fresh id rather than logged or stored.
func requestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if !validRequestID(id) {
			id = newRequestID()
			c.Request().Header.Set(echo.HeaderXRequestID, id)
		}
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7E {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// limitBody reads every request body in full, up to limit bytes, before
// routing decides anything else: a larger body — announced by
// Content-Length or found while reading a chunked one — is 413
// body-too-large here, in one place, whatever the route would have done
// with it (a form parser would otherwise see an empty form, a JSON decoder
// a read error). Handlers then read a buffer that cannot fail.
func limitBody(limit int64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			req := c.Request()
			if req.Body == nil || req.Body == http.NoBody {
				return next(c)
			}
			if req.ContentLength > limit {
				return bodyTooLarge(limit)
			}
			body, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
			req.Body.Close()
			if err != nil {
				return refuse(errBodyUnreadable, "Request body unreadable",
					"the request body could not be read to its end")
			}
			if int64(len(body)) > limit {
				return bodyTooLarge(limit)
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.ContentLength = int64(len(body))
			return next(c)
		}
	}
}

func bodyTooLarge(limit int64) *refusal {
	return refuse(errBodyTooLarge, "Request body too large",
		fmt.Sprintf("the request body is larger than the %d bytes this server accepts", limit))
}

// refuseOtherMethods answers 405 with Allow when the path exists but not
// with this method. Echo's router already does so, except for OPTIONS,
// which it answers 204 as if for CORS; idemlab serves no cross-origin
// clients, so OPTIONS is one more method it does not allow. The router
// leaves the path's methods under ContextKeyHeaderAllow exactly in these
// cases.
func refuseOtherMethods(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		allow, ok := c.Get(echo.ContextKeyHeaderAllow).(string)
		if !ok {
			return next(c)
		}
		c.Response().Header().Set(echo.HeaderAllow, strings.TrimPrefix(allow, http.MethodOptions+", "))
		return echo.ErrMethodNotAllowed
	}
}

// trustedProxies are the addresses whose X-Forwarded-For and
// X-Forwarded-Proto are believed (TRUSTED_PROXIES). With none, both
// headers are ignored: the client's address is the connection's, and the
// scheme is https only over TLS to this process.
func trustedProxies(e *echo.Echo, nets []*net.IPNet) {
	if len(nets) == 0 {
		e.IPExtractor, e.SchemeExtractor = echo.ExtractIPDirect(), echo.ExtractSchemeDirect()
		return
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range nets {
		opts = append(opts, echo.TrustIPRange(n))
	}
	e.IPExtractor, e.SchemeExtractor = echo.ExtractIPFromXFFHeader(opts...), echo.ExtractSchemeFromHeaders(opts...)
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
