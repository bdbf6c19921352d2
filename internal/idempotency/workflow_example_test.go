package idempotency_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemlab/idemlab/internal/idempotency"
)

// createNote is a workflow that stays in PostgreSQL, written as
// docs/idempotency.md shows: the request's key is claimed by the first
// statement of its one transaction and the answer is stored by the last, so
// the claim, the business write and the answer commit once.
func createNote(ctx context.Context, pool *pgxpool.Pool, userID int64, note string) (idempotency.Response, error) {
	var answer idempotency.Response
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Mine, or ErrAlreadyClaimed: a duplicate got there first, and the
		// middleware will answer with its stored response. A nil attempt (no
		// middleware) claims nothing, and Complete then does nothing.
		claim, err := idempotency.AttemptFrom(ctx).Claim(ctx, tx)
		if err != nil {
			return err
		}
		var id int64
		if err := tx.QueryRow(ctx,
			`INSERT INTO notes (user_id, note) VALUES ($1, $2) RETURNING id`, userID, note).Scan(&id); err != nil {
			return err
		}
		if answer, err = idempotency.JSONResponse(http.StatusCreated, map[string]any{"id": id}); err != nil {
			return err
		}
		// ErrLeaseLost: someone took the key over; the whole transaction rolls back.
		return claim.Complete(ctx, tx, answer)
	})
	return answer, err
}

// The documented workflow behind the middleware: the first request executes,
// the retry replays the stored bytes, and one note exists.
func TestDocumentedWorkflow(t *testing.T) {
	t.Parallel()
	b := newEnv(t).bundle(t)
	e := echo.New()
	e.POST("/notes", func(c echo.Context) error {
		answer, err := createNote(c.Request().Context(), b.pool, b.alice, c.FormValue("note"))
		if err != nil {
			return err
		}
		return answer.Write(c)
	}, idempotency.Middleware(b.store, idempotency.Config{
		Scope: func(echo.Context) (int64, bool) { return b.alice, true }, // the signed-in user
	}))
	var answers []string
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/notes", strings.NewReader("note=hello"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", "4b1c0f0e-9a43-4c3e-9d2b-5f6a7b8c9d0e")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		answers = append(answers, fmt.Sprint(rec.Code, " ", strings.TrimSpace(rec.Body.String()), " ", rec.Header().Get(idempotency.ReplayedHeader)))
	}
	// "201 {…} " then the same bytes with Idempotent-Replayed: "201 {…} true".
	if !strings.HasPrefix(answers[0], "201 ") || answers[1] != answers[0]+"true" {
		t.Errorf("answers = %q; want a 201 and its replay", answers)
	}
	if n := count(t, b.pool, `SELECT count(*) FROM notes WHERE user_id = $1`, b.alice); n != 1 {
		t.Errorf("notes = %d, want 1", n)
	}
}

// docs/idempotency.md shows createNote as the way to write a workflow; the
// sample must be this compiled, tested function, word for word.
func TestDocsShowTheCompiledWorkflow(t *testing.T) {
	src, err := os.ReadFile("workflow_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "workflow_example_test.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var fn string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "createNote" {
			fn = string(src[fset.Position(fd.Doc.Pos()).Offset:fset.Position(fd.End()).Offset])
		}
	}
	doc, err := os.ReadFile("../../docs/idempotency.md")
	if err != nil {
		t.Fatal(err)
	}
	if fn == "" || !strings.Contains(string(doc), "```go\n"+fn+"\n```") {
		t.Errorf("docs/idempotency.md must show createNote from internal/idempotency/workflow_example_test.go verbatim:\n%s", fn)
	}
}
