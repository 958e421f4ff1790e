package inventory

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// aggregateOf says which aggregate a file of the engine belongs to, by its
// name; "" is the engine's own part (holds, and what every aggregate shares).
func aggregateOf(file string) string {
	if file == "product.go" || file == "stock.go" {
		return "Catalog"
	}
	return ""
}

var aggregates = []string{"Catalog"}

// TestAggregatesStayApart checks the engine's cut by aggregate (units.go):
// an aggregate's methods are declared in its own files, and no file calls
// another aggregate's accessor (e.Carts(), e.Catalog(), ...); the engine's
// own part calls none. The aggregates meet only in what the engine shares,
// the sale policy and the script layer.
func TestAggregatesStayApart(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	declared := map[string]int{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "units.go" {
			continue
		}
		own := aggregateOf(f)
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok && isAggregate(id.Name) {
				declared[id.Name]++
				if id.Name != own {
					t.Errorf("%s declares %s.%s: it belongs in the %s files", f, id.Name, fn.Name.Name, id.Name)
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) > 0 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && isAggregate(sel.Sel.Name) && sel.Sel.Name != own {
				t.Errorf("%s (%s) calls %s(): an aggregate reaches another only through the engine's shared parts",
					f, orEngine(own), sel.Sel.Name)
			}
			return true
		})
	}
	for _, a := range aggregates {
		if declared[a] == 0 {
			t.Errorf("no file declares a method of %s: aggregateOf misses its files", a)
		}
	}
}

func isAggregate(name string) bool {
	for _, a := range aggregates {
		if a == name {
			return true
		}
	}
	return false
}

func orEngine(a string) string {
	if a == "" {
		return "the engine's own part"
	}
	return a
}
