package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReasonsRegistry keeps the reasons in one place: every Reason
// constant is registered with a meaning, no non-test Go file outside
// reasons.go spells a reason's string (so a second list cannot drift), and
// the proto's RouteResponse.reason comment names every reason.
func TestReasonsRegistry(t *testing.T) {
	registered := map[string]bool{}
	for _, ri := range Reasons() {
		if registered[string(ri.Reason)] {
			t.Errorf("reason %q registered twice", ri.Reason)
		}
		registered[string(ri.Reason)] = true
		if m, ok := ri.Reason.Meaning(); !ok || m != ri.Meaning || strings.TrimSpace(m) == "" {
			t.Errorf("reason %q: Meaning() = %q, %v; want its non-empty registry line", ri.Reason, m, ok)
		}
	}
	if _, ok := Reason("no_such_reason").Meaning(); ok {
		t.Error("an unknown reason has a meaning")
	}

	// Every constant of type Reason in this package is registered.
	fset := token.NewFileSet()
	pkgFiles, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	consts := 0
	for _, name := range pkgFiles {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
					continue
				}
				for i, n := range vs.Names {
					consts++
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok {
						t.Errorf("%s: %s is not a string literal", name, n.Name)
						continue
					}
					if v, _ := strconv.Unquote(lit.Value); !registered[v] {
						t.Errorf("%s: reason constant %s = %s is not in the registry", name, n.Name, lit.Value)
					}
				}
			}
		}
	}
	if consts != len(registered) {
		t.Errorf("%d Reason constants, %d registered reasons", consts, len(registered))
	}

	// No other file of the module spells a reason.
	root := filepath.Join("..", "..")
	self, _ := filepath.Abs("reasons.go")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || path == filepath.Join(root, "gen")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if abs, _ := filepath.Abs(path); abs == self {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && registered[v] {
					t.Errorf("%s: spells reason %s; use the engine.Reason constant", fset.Position(lit.Pos()), lit.Value)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The API docs list every reason.
	proto, err := os.ReadFile(filepath.Join(root, "proto", "cart", "v1", "router.proto"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)message RouteResponse \{.*?((?:\n *//[^\n]*)+)\n *string reason = 2;`).FindSubmatch(proto)
	if m == nil {
		t.Fatal("router.proto: no comment above RouteResponse.reason")
	}
	for r := range registered {
		if !regexp.MustCompile(`\b` + r + `\b`).Match(m[1]) {
			t.Errorf("router.proto: RouteResponse.reason comment does not list %s", r)
		}
	}
}
