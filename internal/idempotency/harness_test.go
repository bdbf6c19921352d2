package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
	"github.com/idemlab/idemlab/internal/problem"
	"github.com/idemlab/idemlab/internal/testdb"
)

const (
	testLease = 30 * time.Second
	testTTL   = 24 * time.Hour
)

// env is one fresh database shared by a group of subtests. Creating a
// database costs about a second on a slow disk, and sharing is safe: keys are
// scoped per user and every subtest takes its own users, and the clock
// override belongs to a store and every subtest takes its own store. Only
// tests of the janitor, whose purge spans all users, need an env to themselves.
type env struct {
	pool *pgxpool.Pool
}

func newEnv(t testing.TB) *env {
	t.Helper()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(context.Background(), `
		CREATE TABLE notes (
		    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		    user_id bigint NOT NULL,
		    note    text   NOT NULL
		)`); err != nil {
		t.Fatal(err)
	}
	return &env{pool: db.Pool}
}

// bundle is what a test works with: two users of its own, a store (lease
// 30 s, TTL 24 h) and the pool, whose notes table stands in for business writes.
type bundle struct {
	pool       *pgxpool.Pool
	store      *idempotency.Store
	alice, bob int64
}

func (e *env) bundle(t testing.TB) bundle {
	t.Helper()
	b := bundle{pool: e.pool, store: idempotency.NewStore(e.pool, testLease, testTTL)}
	for _, u := range []struct {
		name string
		id   *int64
	}{{"alice", &b.alice}, {"bob", &b.bob}} {
		if err := e.pool.QueryRow(context.Background(), `
			INSERT INTO users (name, api_token_sha256)
			VALUES ($1::text, sha256(convert_to($1::text, 'UTF8')))
			RETURNING id`, t.Name()+"/"+u.name).Scan(u.id); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// subtest is one case of a group sharing an env.
type subtest struct {
	name string
	run  func(t *testing.T, b bundle)
}

// runGroup runs the subtests in parallel on one env.
func runGroup(t *testing.T, tests []subtest) {
	e := newEnv(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, e.bundle(t))
		})
	}
}

// count runs a SELECT count(*) … query.
func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// later moves the store's clock d past the real one.
func later(d time.Duration) time.Time { return time.Now().Add(d) }

// app is a small Echo server using the middleware as cmd/web will: a JSON
// route and a form route, each creating a note inside one transaction with
// the claim's completion.
type app struct {
	pool  *pgxpool.Pool
	store *idempotency.Store
	// executions counts handler bodies that got past validation.
	executions atomic.Int64
	// delay holds the transaction open, so duplicates arrive mid-flight.
	delay time.Duration
	// started, if set, receives once the handler body runs.
	started chan struct{}
}

func (a *app) server(t testing.TB, cfg idempotency.Config) *httptest.Server {
	t.Helper()
	e := echo.New()
	e.HideBanner = true
	// The real server's error handler does the same: a *problem.Problem is
	// written as problem+json; anything else is a 500 without internals.
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		var p *problem.Problem
		var he *echo.HTTPError
		switch {
		case errors.As(err, &p):
		case errors.As(err, &he):
			p = problem.New(he.Code, "http-error", http.StatusText(he.Code), "")
		default:
			p = problem.New(http.StatusInternalServerError, "internal", "Internal Server Error", "")
		}
		problem.Write(c.Response(), p)
	}
	// As Echo's Recover middleware does: a panic becomes a 500 for this
	// request instead of a dropped connection.
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New("panic recovered")
				}
			}()
			return next(c)
		}
	})

	scope := func(c echo.Context) (int64, bool) {
		id, err := strconv.ParseInt(c.Request().Header.Get("X-User"), 10, 64)
		return id, err == nil
	}
	jsonCfg := cfg
	jsonCfg.Scope = scope
	api := e.Group("/api", idempotency.Middleware(a.store, jsonCfg))
	api.POST("/notes", a.createNote)
	api.POST("/notes/:id/missing", func(c echo.Context) error {
		return problem.New(http.StatusNotFound, "not-found", "Not found", "no note "+c.Param("id"))
	})
	api.POST("/fail", func(c echo.Context) error { return errors.New("database on fire") })
	api.POST("/panic", func(c echo.Context) error { panic("handler bug") })

	formCfg := cfg
	formCfg.Scope = scope
	formCfg.KeyFrom = idempotency.FromFormField
	formCfg.HTML = func(c echo.Context, p *problem.Problem) error {
		return c.HTML(p.Status, "<p class=notice>"+p.Title+"</p>")
	}
	forms := e.Group("/forms", idempotency.Middleware(a.store, formCfg))
	forms.POST("/notes", a.createNoteForm)

	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func (a *app) createNote(c echo.Context) error {
	var in struct {
		Note string `json:"note"`
	}
	if err := c.Bind(&in); err != nil {
		return idempotency.Reject(err)
	}
	if in.Note == "" {
		return idempotency.Reject(problem.New(http.StatusBadRequest, "validation-failed", "Invalid note", "note is required"))
	}
	resp, err := a.insertNote(c, in.Note, func(id int64) (idempotency.Response, error) {
		return idempotency.JSONResponse(http.StatusCreated, map[string]any{"id": id, "note": in.Note})
	})
	if err != nil {
		return err
	}
	return resp.Write(c)
}

func (a *app) createNoteForm(c echo.Context) error {
	note := c.FormValue("note")
	if note == "" {
		return idempotency.Reject(problem.New(http.StatusBadRequest, "validation-failed", "Invalid note", "note is required"))
	}
	resp, err := a.insertNote(c, note, func(id int64) (idempotency.Response, error) {
		return idempotency.RedirectResponse(http.StatusSeeOther, "/notes/"+strconv.FormatInt(id, 10)), nil
	})
	if err != nil {
		return err
	}
	return resp.Write(c)
}

// insertNote is the business write and the claim's completion in one
// transaction: both commit or neither does.
func (a *app) insertNote(c echo.Context, note string, respond func(id int64) (idempotency.Response, error)) (idempotency.Response, error) {
	a.executions.Add(1)
	if a.started != nil {
		a.started <- struct{}{}
	}
	ctx := c.Request().Context()
	claim := idempotency.ClaimFrom(ctx)
	var resp idempotency.Response
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO notes (user_id, note) VALUES ($1, $2) RETURNING id`,
			claim.UserID, note).Scan(&id); err != nil {
			return err
		}
		time.Sleep(a.delay)
		var err error
		if resp, err = respond(id); err != nil {
			return err
		}
		return claim.Complete(ctx, tx, resp)
	})
	return resp, err
}

// result is one HTTP exchange, read fully.
type result struct {
	status int
	header http.Header
	body   string
}

func (r result) replayed() bool { return r.header.Get(idempotency.ReplayedHeader) == "true" }

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// post sends a POST as user with key in the Idempotency-Key header (none
// when key is "-").
func post(t testing.TB, srv *httptest.Server, path string, user int64, key, contentType, body string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-User", strconv.FormatInt(user, 10))
	req.Header.Set("Content-Type", contentType)
	if key != "-" {
		req.Header.Set(idempotency.HeaderName, key)
	}
	return do(t, req)
}

func postJSON(t testing.TB, srv *httptest.Server, path string, user int64, key, body string) result {
	t.Helper()
	return post(t, srv, path, user, key, "application/json", body)
}

func postForm(t testing.TB, srv *httptest.Server, path string, user int64, form url.Values) result {
	t.Helper()
	return post(t, srv, path, user, "-", "application/x-www-form-urlencoded", form.Encode())
}

func do(t testing.TB, req *http.Request) result {
	t.Helper()
	res, err := noRedirect.Do(req)
	if err != nil {
		t.Error(err) // Error, not Fatal: do runs in goroutines too
		return result{}
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return result{status: res.StatusCode, header: res.Header, body: string(body)}
}

// sameResponse fails unless b replays a byte for byte.
func sameResponse(t testing.TB, a, b result) {
	t.Helper()
	if a.status != b.status || a.body != b.body ||
		a.header.Get("Content-Type") != b.header.Get("Content-Type") ||
		a.header.Get("Location") != b.header.Get("Location") {
		t.Errorf("replay differs:\n first: %d %q %q %q\nreplay: %d %q %q %q",
			a.status, a.header.Get("Content-Type"), a.header.Get("Location"), a.body,
			b.status, b.header.Get("Content-Type"), b.header.Get("Location"), b.body)
	}
	if !bytes.Equal([]byte(a.body), []byte(b.body)) {
		t.Error("bodies differ")
	}
}
