package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoFailNowOffTheTestGoroutine keeps a rule of the test suite: a
// goroutine a test spawns (a go statement, a function given to Go or to
// inventory's race) reports its errors to the test goroutine and never calls
// require or t.Fatal, whose FailNow would only end that goroutine, leaving
// the test running on half its checks. Helpers called from such goroutines
// are the reviewer's to check; this sees the literal bodies only.
func TestNoFailNowOffTheTestGoroutine(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	var found []string
	for path, src := range repoFiles(t) {
		if !strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		require.NoError(t, err, path)
		for _, lit := range spawnedLiterals(f) {
			ast.Inspect(lit.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				x, ok := sel.X.(*ast.Ident)
				if ok && (x.Name == "require" || x.Name == "t" && (strings.HasPrefix(sel.Sel.Name, "Fatal") || sel.Sel.Name == "FailNow")) {
					found = append(found, fset.Position(call.Pos()).String()+": "+x.Name+"."+sel.Sel.Name)
				}
				return true
			})
		}
	}
	require.Empty(t, found, "FailNow called off the test goroutine: return the error to the test instead")
}

// spawnedLiterals returns the function literals of f that run on a goroutine
// of their own.
func spawnedLiterals(f *ast.File) []*ast.FuncLit {
	var lits []*ast.FuncLit
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			if lit, ok := n.Call.Fun.(*ast.FuncLit); ok {
				lits = append(lits, lit)
			}
		case *ast.CallExpr:
			name := ""
			switch fn := n.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			case *ast.Ident:
				name = fn.Name
			}
			if name == "Go" || name == "race" {
				for _, a := range n.Args {
					if lit, ok := a.(*ast.FuncLit); ok {
						lits = append(lits, lit)
					}
				}
			}
		}
		return true
	})
	return lits
}
