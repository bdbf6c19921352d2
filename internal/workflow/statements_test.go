package workflow

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Every place the engine names a statement for the timeline names one that
// Statement resolves — a string literal, "workflow.sqlStepSent", never the
// statement's text (a name and a text are both strings: the compiler cannot
// tell them apart, this test does).
func TestTimelineNamesResolve(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// the argument that names the statement, by callee
	nameArg := map[string]int{"event": 5, "transition": 3, "recordClaims": 4, "noteTruthThen": 3}
	check := func(where token.Pos, e ast.Expr) {
		switch e := e.(type) {
		case *ast.BasicLit:
			name, _ := strconv.Unquote(e.Value)
			if _, ok := Statement(name); name != "" && !ok {
				t.Errorf("%s: the timeline names %q, which Statement does not resolve", fset.Position(where), name)
			}
		case *ast.Ident:
			if e.Name != "statement" && e.Name != "name" { // passed on by the function that took it
				t.Errorf("%s: the timeline is given %s, not a statement's name", fset.Position(where), e.Name)
			}
		default:
			t.Errorf("%s: the timeline is given a computed name", fset.Position(where))
		}
	}
	seen := 0
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				var callee string
				switch fn := n.Fun.(type) {
				case *ast.SelectorExpr:
					callee = fn.Sel.Name
				case *ast.Ident:
					callee = fn.Name
				}
				if i, ok := nameArg[callee]; ok && len(n.Args) > i {
					check(n.Pos(), n.Args[i])
					seen++
				}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "event" {
					for _, el := range n.Elts {
						if kv, ok := el.(*ast.KeyValueExpr); ok && kv.Key.(*ast.Ident).Name == "statement" {
							check(kv.Pos(), kv.Value)
							seen++
						}
					}
				}
			}
			return true
		})
	}
	if seen < 20 {
		t.Errorf("found %d places that name a statement; the engine has more: is the test still looking?", seen)
	}
}
