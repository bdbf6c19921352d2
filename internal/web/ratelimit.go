package web

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/idemlab/idemlab/internal/problem"
)

// Rate limits: token buckets (golang.org/x/time/rate) per client address or
// per user, in this process's memory. Each replica counts for itself, so
// behind N replicas a client gets up to N times a limit: the limits stop a
// flood, they are not a quota. docs/api.md "Rate limits" lists them.

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
	Labs:             Rate{4, time.Minute},
}

// limiter is one kind of limit: a bucket per key.
type limiter struct {
	name string
	rate Rate

	mu      sync.Mutex
	buckets map[string]*bucket
	adds    int // since the last sweep
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiter(name string, r Rate) *limiter {
	return &limiter{name: name, rate: r, buckets: map[string]*bucket{}}
}

// get returns key's bucket. Now and then it drops buckets idle for longer
// than refilling takes: a full bucket and a missing one behave the same, so
// memory stays bounded by the clients of the last few periods.
func (l *limiter) get(key string, now time.Time) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if l.adds++; l.adds >= 1024 {
			l.adds = 0
			for k, old := range l.buckets {
				if now.Sub(old.seen) > l.rate.Per {
					delete(l.buckets, k)
				}
			}
		}
		every := l.rate.Per / time.Duration(l.rate.Events)
		b = &bucket{lim: rate.NewLimiter(rate.Every(every), l.rate.Events)}
		l.buckets[key] = b
	}
	b.seen = now
	return b.lim
}

// take spends one event of key's bucket. When none is left it spends
// nothing and says how long until one is.
func (l *limiter) take(key string) (ok bool, retryAfter time.Duration) {
	if l.rate.Events == 0 {
		return true, 0
	}
	now := time.Now()
	lim := l.get(key, now)
	r := lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// empty reports whether key's bucket has nothing left, without spending.
func (l *limiter) empty(key string) (bool, time.Duration) {
	if l.rate.Events == 0 {
		return false, 0
	}
	now := time.Now()
	lim := l.get(key, now)
	if lim.TokensAt(now) >= 1 {
		return false, 0
	}
	r := lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	r.CancelAt(now)
	return true, d
}

// limits are the app's limiters.
type limits struct {
	exempt           []*net.IPNet
	signIn, badToken *limiter
	writesPerUser    *limiter
	writesPerAddress *limiter
	labs             *limiter
}

func newLimits(cfg RateLimits) *limits {
	return &limits{
		exempt:           cfg.Exempt,
		signIn:           newLimiter("sign-in", cfg.SignIn),
		badToken:         newLimiter("bad-token", cfg.BadToken),
		writesPerUser:    newLimiter("writes-per-user", cfg.WritesPerUser),
		writesPerAddress: newLimiter("writes-per-address", cfg.WritesPerAddress),
		labs:             newLimiter("labs", cfg.Labs),
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
	if ok, wait := l.take(key); !ok {
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
	return problem.New(http.StatusTooManyRequests, "rate-limited", "Too many requests",
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
// connections of its own, so a user gets a few a minute.
func (app *App) limitLabs(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		u, _ := userFrom(c)
		if err := app.limits.allow(c, app.limits.labs, userKeyOf(u.ID)); err != nil {
			return err
		}
		return next(c)
	}
}
