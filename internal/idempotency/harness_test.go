package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
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

// app is a small Echo server using the middleware as internal/web does: a
// JSON route and a form route, each a one-transaction workflow that claims
// the key, creates a note and stores the answer in one commit.
type app struct {
	pool  *pgxpool.Pool
	store *idempotency.Store
	// executions counts workflows that claimed the key and ran their
	// business write (whether or not they committed).
	executions atomic.Int64
	// delay holds the transaction open, so duplicates arrive mid-flight.
	delay time.Duration
	// started, if set, receives once a workflow holds the key.
	started chan struct{}
	// proceed, if set, is waited on between the first commit and the second
	// of the two-step route, as an owner paused mid-request would.
	proceed chan struct{}
}

// refusalAnswers are the answers the app's error table
// (internal/web/errors.go) gives the protocol's refusals.
var refusalAnswers = []struct {
	err    error
	status int
	typ    string
	title  string
}{
	{idempotency.ErrNotSignedIn, http.StatusUnauthorized, "unauthenticated", "Not signed in"},
	{idempotency.ErrKeyMissing, http.StatusBadRequest, "idempotency-key-missing", "Idempotency key missing"},
	{idempotency.ErrKeyMalformed, http.StatusBadRequest, "idempotency-key-malformed", "Idempotency key malformed"},
	{idempotency.ErrFingerprintMismatch, http.StatusUnprocessableEntity, "idempotency-key-reused", "Idempotency key reused"},
	{idempotency.ErrInProgress, http.StatusConflict, "request-in-progress", "Request in progress"},
	{idempotency.ErrBodyUnreadable, http.StatusBadRequest, "request-body-unreadable", "Request body unreadable"},
	{idempotency.ErrBodyTooLarge, http.StatusRequestEntityTooLarge, "body-too-large", "Request too large"},
}

func refusalProblem(r *idempotency.Refusal) *problem.Problem {
	for _, a := range refusalAnswers {
		if errors.Is(r, a.err) {
			return problem.New(a.status, a.typ, a.title, r.Detail)
		}
	}
	return problem.New(http.StatusInternalServerError, "internal", "Internal Server Error", "")
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
		var r *idempotency.Refusal
		var he *echo.HTTPError
		switch {
		case errors.As(err, &p):
		case errors.As(err, &r):
			p = refusalProblem(r)
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
	api.POST("/notes/:id/missing", a.missingNote)
	api.POST("/fail", a.fail)
	api.POST("/panic", a.panicAfterClaim)
	api.POST("/two-step", a.twoStep)

	formCfg := cfg
	formCfg.Scope = scope
	formCfg.KeyFrom = idempotency.FromFormField
	formCfg.HTML = func(c echo.Context, r *idempotency.Refusal) error {
		p := refusalProblem(r)
		return c.HTML(p.Status, "<p class=notice>"+p.Title+"</p>")
	}
	forms := e.Group("/forms", idempotency.Middleware(a.store, formCfg))
	forms.POST("/notes", a.createNoteForm)
	forms.POST("/two-step", a.twoStep)

	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func (a *app) createNote(c echo.Context) error {
	var in struct {
		Note string `json:"note"`
	}
	if err := c.Bind(&in); err != nil {
		return err // refused before the workflow: nothing claimed, nothing stored
	}
	if in.Note == "" {
		return problem.New(http.StatusBadRequest, "validation-failed", "Invalid note", "note is required")
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
		return problem.New(http.StatusBadRequest, "validation-failed", "Invalid note", "note is required")
	}
	resp, err := a.insertNote(c, note, func(id int64) (idempotency.Response, error) {
		return idempotency.RedirectResponse(http.StatusSeeOther, "/notes/"+strconv.FormatInt(id, 10)), nil
	})
	if err != nil {
		return err
	}
	return resp.Write(c)
}

// insertNote is a workflow that stays in PostgreSQL: the claim, the business
// write and the stored answer in one transaction — one commit.
func (a *app) insertNote(c echo.Context, note string, respond func(id int64) (idempotency.Response, error)) (idempotency.Response, error) {
	ctx := c.Request().Context()
	var resp idempotency.Response
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		claim, err := idempotency.AttemptFrom(ctx).Claim(ctx, tx)
		if err != nil {
			return err
		}
		a.executions.Add(1)
		if a.started != nil {
			a.started <- struct{}{}
		}
		var id int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO notes (user_id, note) VALUES ($1, $2) RETURNING id`,
			claim.UserID, note).Scan(&id); err != nil {
			return err
		}
		time.Sleep(a.delay)
		if resp, err = respond(id); err != nil {
			return err
		}
		return claim.Complete(ctx, tx, resp)
	})
	return resp, err
}

// missingNote is a workflow whose answer is a business refusal (no such
// note): the refusal is stored with the claim, in one commit, and replayed.
func (a *app) missingNote(c echo.Context) error {
	ctx := c.Request().Context()
	var resp idempotency.Response
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		claim, err := idempotency.AttemptFrom(ctx).Claim(ctx, tx)
		if err != nil {
			return err
		}
		a.executions.Add(1)
		body, _ := json.Marshal(problem.New(http.StatusNotFound, "not-found", "Not found", "no note "+c.Param("id")))
		resp = idempotency.Response{Status: http.StatusNotFound, Header: http.Header{"Content-Type": {problem.ContentType}}, Body: body}
		return claim.Complete(ctx, tx, resp)
	})
	if err != nil {
		return err
	}
	return resp.Write(c)
}

// fail claims the key, then fails: the transaction rolls back, the claim
// with it.
func (a *app) fail(c echo.Context) error {
	ctx := c.Request().Context()
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if _, err := idempotency.AttemptFrom(ctx).Claim(ctx, tx); err != nil {
			return err
		}
		a.executions.Add(1)
		return errors.New("database on fire")
	})
}

// panicAfterClaim commits its claim (as a workflow with an external call
// does before the call) and then panics: the key stays IN_PROGRESS.
func (a *app) panicAfterClaim(c echo.Context) error {
	ctx := c.Request().Context()
	if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		_, err := idempotency.AttemptFrom(ctx).Claim(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	a.executions.Add(1)
	panic("handler bug")
}

// twoStep is a workflow with an external call in the middle: commit 1 is the
// claim (with the intent, in a real workflow); commit 2 stores the answer.
// An error "outcome" in the body makes the second commit fail after the
// first committed.
func (a *app) twoStep(c echo.Context) error {
	ctx := c.Request().Context()
	var claim *idempotency.Claim
	if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var err error
		claim, err = idempotency.AttemptFrom(ctx).Claim(ctx, tx)
		return err
	}); err != nil {
		return err
	}
	a.executions.Add(1)
	if a.started != nil {
		a.started <- struct{}{}
	}
	if a.proceed != nil {
		<-a.proceed // the call to the other system, or a pause of the whole process
	}
	body, _ := io.ReadAll(c.Request().Body)
	if strings.Contains(string(body), "fail") {
		return errors.New("could not record the outcome")
	}
	resp, _ := idempotency.JSONResponse(http.StatusOK, map[string]string{"done": "by execution " + strconv.FormatInt(a.executions.Load(), 10)})
	if err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error { return claim.Complete(ctx, tx, resp) }); err != nil {
		return err
	}
	return resp.Write(c)
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
