package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/dropline/dropline/"

// root is the repository, two folders up from this package.
const root = "../.."

// layers ranks the module's packages: a package imports only packages of a
// lower layer (its tests may import what they like). A package the table
// does not name fails the test, so each new package is placed on purpose.
// A prefix ending in "/" ranks every package under it.
var layers = map[string]int{
	// Below the leaves: a request's header fields, which auth reads too.
	"internal/header": 0,
	// Leaves: know nothing of Dropline's other packages.
	"inventory/outcome": 1, "internal/clientaddr": 1, "internal/machine": 1, "internal/prom": 1,
	"internal/requestid": 1, "internal/startstop": 1, "internal/testsignal": 1, "internal/tracing": 1,
	"internal/websocket": 1, "internal/wsclient": 1, "internal/webhooktest": 1, "auth": 1,
	"graph/model": 1, "server/static": 1, "internal/archtest": 1, "internal/otlpreceiver": 1,
	"internal/batch": 1, "internal/cpugate": 1, "internal/loopback": 1,
	// Built on the leaves only.
	"inventory/policy": 2, "db": 2, "graph": 2, "server/playground": 2, "server/shop": 2, "server": 2,
	// Built on the ledger.
	"internal/drawverify": 3, "internal/testenv": 3,
	// The scripts, then the script layer, the engine's shared core, its
	// aggregates and the engine over them.
	"lua":              3,
	"inventory/script": 4, "internal/scripttest": 4,
	"inventory/core": 5,
	// The engine's aggregates share one layer, so none imports another:
	// they meet only in the core, the script layer, the policy and the
	// outcomes below them, and the engine above hands each its core.
	"inventory/cart": 6, "inventory/draw": 6, "inventory/drop": 6, "inventory/waitlist": 6,
	"inventory": 7,
	// What builds on the engine.
	"inventory/queue": 8, "webhook": 8,
	"live": 9, "worker": 9,
	"resolvers":      10,
	"server/graphql": 11,
	"config":         12, "internal/graphqltest": 12,
	"app": 13,
	// The load drivers and benchmarks, then the programs and whole-system tests.
	"bench/": 14,
	"cmd/":   15, "e2e/": 15,
}

func layerOf(pkg string) (int, bool) {
	if l, ok := layers[pkg]; ok {
		return l, true
	}
	best, rank := "", 0
	for p, l := range layers {
		if strings.HasSuffix(p, "/") && strings.HasPrefix(pkg+"/", p) && len(p) > len(best) {
			best, rank = p, l
		}
	}
	return rank, best != ""
}

// goFiles walks the repository's Go files, skipping node_modules and
// dot folders.
func goFiles(t *testing.T, visit func(path, rel string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, _ := filepath.Rel(root, path)
			visit(path, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNoPackageImportsUpward checks every import of the module's own
// packages (outside tests) against the layers.
func TestNoPackageImportsUpward(t *testing.T) {
	fset := token.NewFileSet()
	seen := map[string]bool{}
	goFiles(t, func(path, rel string) {
		if strings.HasSuffix(rel, "_test.go") {
			return
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		from, ok := layerOf(pkg)
		if !ok {
			if !seen[pkg] {
				t.Errorf("package %s is in no layer: place it in layers", pkg)
			}
			seen[pkg] = true
			return
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, module) {
				continue
			}
			to, ok := layerOf(strings.TrimPrefix(p, module))
			if !ok {
				continue // reported as its own package
			}
			switch {
			case to == from:
				t.Errorf("%s (layer %d) imports %s of its own layer: packages of one layer (the engine's aggregates) never import each other",
					rel, from, strings.TrimPrefix(p, module))
			case to > from:
				t.Errorf("%s (layer %d) imports %s (layer %d): imports point down only", rel, from, strings.TrimPrefix(p, module), to)
			}
		}
	})
}

// generated says whether a Go file is generated (gqlgen's, and the
// resolvers' stubs it keeps up to date).
func generated(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	head := string(b[:min(len(b), 400)])
	return strings.Contains(head, "// Code generated") && strings.Contains(head, "DO NOT EDIT")
}

// maxLines is the most lines a hand-written Go file may have.
const maxLines = 700

func TestNoHandWrittenFileIsLong(t *testing.T) {
	goFiles(t, func(path, rel string) {
		if strings.HasPrefix(rel, "graph/") || generated(path) {
			return
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > maxLines {
			t.Errorf("%s has %d lines; split it by what it does (at most %d)", rel, n, maxLines)
		}
	})
}

// maxMethods is the most exported methods a type may have.
const maxMethods = 25

// notYetCut lists the types over maxMethods that are still to be cut, and
// why they are not yet; the test fails once one is cut and still listed.
var notYetCut = map[string]string{}

func TestNoTypeHasManyExportedMethods(t *testing.T) {
	fset := token.NewFileSet()
	count := map[string]int{} // package/Type -> exported methods
	goFiles(t, func(path, rel string) {
		if strings.HasPrefix(rel, "graph/") || strings.HasSuffix(rel, "_test.go") {
			return
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || !fn.Name.IsExported() {
				continue
			}
			typ := fn.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if g, ok := typ.(*ast.IndexExpr); ok {
				typ = g.X
			}
			id, ok := typ.(*ast.Ident)
			if !ok {
				continue
			}
			count[filepath.ToSlash(filepath.Dir(rel))+"."+id.Name]++
		}
	})
	if count["inventory.Engine"] == 0 {
		t.Fatal("found no exported method of inventory.Engine: the walk missed the code")
	}
	var over []string
	for typ, why := range notYetCut {
		if count[typ] <= maxMethods {
			t.Errorf("%s has %d exported methods now: take it off notYetCut (%s)", typ, count[typ], why)
		}
	}
	for typ, n := range count {
		if n > maxMethods && notYetCut[typ] == "" {
			over = append(over, typ+": "+strconv.Itoa(n))
		}
	}
	sort.Strings(over)
	for _, o := range over {
		t.Errorf("%s exported methods; at most %d (cut the type by what it serves)", o, maxMethods)
	}
}
