package web

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/database"
)

// Rate limits: token buckets per client address or per user, kept in
// PostgreSQL (the rate_buckets table), so every replica spends from the same
// bucket and N replicas allow the documented rate, not N times it. A take is
// one statement on an unlogged table: a round trip, with no flush to wait
// for (migrations/00115_rate_buckets.sql says why that is enough). The
// database's clock refills the buckets, as it decides every other time here.
// docs/api.md "Rate limits" lists them.

// Rate is "Events per Per", with a burst of Events: 10/m lets ten through at
// once, then one every six seconds. The zero Rate is no limit.
type Rate struct {
	Events int
	Per    time.Duration
}

// ParseRate reads a limit such as "10/m", "20/s", "300/h" or "off".
func ParseRate(s string) (Rate, error) {
	if s == "off" || s == "0" {
		return Rate{}, nil
	}
	n, unit, ok := strings.Cut(s, "/")
	events, err := strconv.Atoi(n)
	per := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	if !ok || err != nil || events < 1 || events > 1_000_000 || per == 0 {
		return Rate{}, fmt.Errorf("%q is not a rate such as 10/m (N per s, m or h) or off", s)
	}
	return Rate{Events: events, Per: per}, nil
}

func (r Rate) String() string {
	if r.Events == 0 {
		return "off"
	}
	return fmt.Sprintf("%d/%s", r.Events, map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Per])
}

// RateLimits are the limits in force (RATE_LIMIT_*).
type RateLimits struct {
	SignIn           Rate // sign-in attempts per client address
	BadToken         Rate // requests with an unknown bearer token, per client address
	WritesPerUser    Rate // mutating API calls and forms per user (token or session)
	WritesPerAddress Rate // the same, per client address
	Labs             Rate // lab runs per user (race lab, double-click lab)
	// Exempt addresses are never limited: the host a load test runs from.
	Exempt []*net.IPNet
}

// DefaultRateLimits stop floods without getting in the way of a person, the
// test suite, or the load tool's 200 users (whose one address needs Exempt,
// or WritesPerAddress off, to go past 200 writes a second).
var DefaultRateLimits = RateLimits{
	SignIn:           Rate{10, time.Minute},
	BadToken:         Rate{20, time.Minute},
	WritesPerUser:    Rate{20, time.Second},
	WritesPerAddress: Rate{200, time.Second},
	// A reader clicking through every lab in order — the numbered labs, the
	// race lab, the double-click lab — and then running a few again is
	// never refused (issue 29, finding 22: at 4 a minute the walk met a 429
	// by the fifth lab); a script running labs in a loop is.
	Labs: Rate{30, time.Minute},
}

// limiter is one kind of limit: a bucket per key.
type limiter struct {
	name string
	rate Rate
	db   database.DBTX
	// takes counts this process's takes; every purgeEvery-th one deletes
	// the buckets that have been full for a while (a full bucket and a
	// missing one behave the same).
	takes atomic.Int64
}

const purgeEvery = 1024

func newLimiter(name string, r Rate, db database.DBTX) *limiter {
	return &limiter{name: name, rate: r, db: db}
}

// perSecond is the refill rate.
func (l *limiter) perSecond() float64 { return float64(l.rate.Events) / l.rate.Per.Seconds() }

// take spends one event of key's bucket. When none is left it spends
// nothing and says how long until one is.
func (l *limiter) take(ctx context.Context, key string) (ok bool, retryAfter time.Duration, err error) {
	if l.rate.Events == 0 {
		return true, 0, nil
	}
	if l.takes.Add(1)%purgeEvery == 0 {
		if _, err := l.db.Exec(ctx, `
			DELETE FROM rate_buckets
			 WHERE limit_name = $1
			   AND at < now() - make_interval(secs => $2) -- refilled long ago: full`,
			l.name, l.rate.Per.Seconds()); err != nil {
			return false, 0, fmt.Errorf("web: purge rate buckets: %w", err)
		}
	}
	// The bucket's tokens now are its tokens at `at` plus the refill since,
	// at most the burst ($3); one is spent when there is one. The row lock
	// orders concurrent takes, from every replica.
	var tokens float64
	err = l.db.QueryRow(ctx, `
		INSERT INTO rate_buckets AS b (limit_name, key, tokens, at, taken)
		VALUES ($1, $2, $3 - 1, now(), true)
		    ON CONFLICT (limit_name, key) DO UPDATE
		   SET tokens = least($3, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $4)
		                - CASE WHEN least($3, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $4) >= 1
		                       THEN 1 ELSE 0 END,
		       taken  = least($3, b.tokens + greatest(0, extract(epoch FROM now() - b.at)) * $4) >= 1,
		       at     = greatest(b.at, now())
		RETURNING taken, tokens`,
		l.name, key, float64(l.rate.Events), l.perSecond()).Scan(&ok, &tokens)
	if err != nil {
		return false, 0, fmt.Errorf("web: take from %s: %w", l.name, err)
	}
	if ok {
		return true, 0, nil
	}
	return false, time.Duration((1 - tokens) / l.perSecond() * float64(time.Second)), nil
}

// empty reports whether key's bucket has nothing left, without spending.
func (l *limiter) empty(ctx context.Context, key string) (bool, time.Duration, error) {
	if l.rate.Events == 0 {
		return false, 0, nil
	}
	var tokens float64
	err := l.db.QueryRow(ctx, `
		SELECT least($3, tokens + greatest(0, extract(epoch FROM now() - at)) * $4)
		  FROM rate_buckets
		 WHERE limit_name = $1
		   AND key = $2`,
		l.name, key, float64(l.rate.Events), l.perSecond()).Scan(&tokens)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, 0, nil // never used: full
	case err != nil:
		return false, 0, fmt.Errorf("web: read %s: %w", l.name, err)
	case tokens >= 1:
		return false, 0, nil
	}
	return true, time.Duration((1 - tokens) / l.perSecond() * float64(time.Second)), nil
}

// limits are the app's limiters.
type limits struct {
	exempt           []*net.IPNet
	signIn, badToken *limiter
	writesPerUser    *limiter
	writesPerAddress *limiter
	labs             *limiter
}

func newLimits(cfg RateLimits, db database.DBTX) *limits {
	return &limits{
		exempt:           cfg.Exempt,
		signIn:           newLimiter("sign-in", cfg.SignIn, db),
		badToken:         newLimiter("bad-token", cfg.BadToken, db),
		writesPerUser:    newLimiter("writes-per-user", cfg.WritesPerUser, db),
		writesPerAddress: newLimiter("writes-per-address", cfg.WritesPerAddress, db),
		labs:             newLimiter("labs", cfg.Labs, db),
	}
}

// exempted reports whether the client's address is in RATE_LIMIT_EXEMPT.
func (ls *limits) exempted(c echo.Context) bool {
	ip := net.ParseIP(c.RealIP())
	for _, n := range ls.exempt {
		if ip != nil && n.Contains(ip) {
			return true
		}
	}
	return false
}

// allow spends one event of key in l, or returns the 429 to answer.
func (ls *limits) allow(c echo.Context, l *limiter, key string) error {
	if ls.exempted(c) {
		return nil
	}
	ok, wait, err := l.take(c.Request().Context(), key)
	if err != nil {
		return err
	}
	if !ok {
		return tooManyRequests(c, l, wait)
	}
	return nil
}

// tooManyRequests is 429 rate-limited with Retry-After in whole seconds.
func tooManyRequests(c echo.Context, l *limiter, wait time.Duration) error {
	secs := int(math.Ceil(wait.Seconds()))
	if secs < 1 {
		secs = 1
	}
	c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
	return refuse(errRateLimited, "Too many requests",
		fmt.Sprintf("at most %s for this kind of request (%s); try again in %d s", l.rate, l.name, secs)).
		With("limit", l.name)
}

func addressKey(c echo.Context) string { return "addr:" + c.RealIP() }

func userKeyOf(id int64) string { return "user:" + strconv.FormatInt(id, 10) }

// limitWrites spends one write of the user and of the address for an
// unsafe method; a safe one passes untouched. It runs after authentication.
func (app *App) limitWrites(c echo.Context) error {
	switch c.Request().Method {
	case http.MethodGet, http.MethodHead:
		return nil
	}
	u, ok := userFrom(c)
	if !ok {
		return nil
	}
	if err := app.limits.allow(c, app.limits.writesPerUser, userKeyOf(u.ID)); err != nil {
		return err
	}
	return app.limits.allow(c, app.limits.writesPerAddress, addressKey(c))
}

// limitSignIn guards POST /signin: attempts per client address.
func (app *App) limitSignIn(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := app.limits.allow(c, app.limits.signIn, addressKey(c)); err != nil {
			return err
		}
		return next(c)
	}
}

// limitLabs guards the labs' runs: each is tens of transactions on
// connections of its own, so a user gets a burst (DefaultRateLimits.Labs).
func (app *App) limitLabs(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		u, _ := userFrom(c)
		if err := app.limits.allow(c, app.limits.labs, userKeyOf(u.ID)); err != nil {
			return err
		}
		return next(c)
	}
}
