package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The house's two size limits (architecture.md, "Where a change goes"): a type of the
// product declares at most maxMethods methods, and a function of the
// product runs at most maxFuncLines lines. Test code and the test wing
// (test/, hack/, the *test packages of test support) are not the product.
const (
	maxMethods   = 30
	maxFuncLines = 80
)

// TestNoProductTypeOrFunctionOutgrowsTheHouse holds the product to the
// limits: a failure names each type with too many methods and each
// function with too many lines, where it is declared.
func TestNoProductTypeOrFunctionOutgrowsTheHouse(t *testing.T) {
	for _, p := range sizeProblems(t, "..") {
		t.Error(p)
	}
}

func TestTheSizeCheckNamesATypeAndAFunctionThatOutgrowIt(t *testing.T) {
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("package big\n\ntype T struct{}\n\n")
	for i := range maxMethods + 1 {
		fmt.Fprintf(&src, "func (*T) M%d() {}\n", i)
	}
	src.WriteString("\nfunc long() {\n" + strings.Repeat("\t_ = 0\n", maxFuncLines) + "}\n")
	writeFile(t, filepath.Join(dir, "big", "big.go"), src.String())
	writeFile(t, filepath.Join(dir, "big", "big_test.go"), "package big\n\nfunc (*T) N() {}\n")
	writeFile(t, filepath.Join(dir, "test", "wing.go"), "package wing\n\nfunc huge() {\n"+strings.Repeat("\t_ = 0\n", 2*maxFuncLines)+"}\n")

	got := sizeProblems(t, dir)
	want := []string{
		fmt.Sprintf("big/big.go:3: type T declares %d methods (at most %d)", maxMethods+1, maxMethods),
		fmt.Sprintf("big/big.go:%d: func long runs %d lines (at most %d)", 4+(maxMethods+1)+2, maxFuncLines+2, maxFuncLines),
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// sizeProblems lists what outgrows the limits under root, sorted.
func sizeProblems(t *testing.T, root string) []string {
	t.Helper()
	type typeAt struct {
		pkg, name string
	}
	methods := map[typeAt]int{}
	declared := map[typeAt]string{}
	var problems []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel == "test" || rel == "hack" || rel == "_output" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if strings.HasSuffix(f.Name.Name, "test") {
			return nil // test support (ensuretest, fakes): the test wing
		}
		pkg := filepath.Dir(rel)
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.GenDecl:
				for _, s := range decl.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						declared[typeAt{pkg, ts.Name.Name}] = fmt.Sprintf("%s:%d", rel, fset.Position(ts.Pos()).Line)
					}
				}
			case *ast.FuncDecl:
				if decl.Recv != nil && len(decl.Recv.List) > 0 {
					methods[typeAt{pkg, receiverName(decl.Recv.List[0].Type)}]++
				}
				if decl.Body == nil {
					continue
				}
				start, end := fset.Position(decl.Pos()).Line, fset.Position(decl.End()).Line
				if n := end - start + 1; n > maxFuncLines {
					problems = append(problems, fmt.Sprintf("%s:%d: func %s runs %d lines (at most %d)", rel, start, decl.Name.Name, n, maxFuncLines))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for typ, n := range methods {
		if n > maxMethods {
			problems = append(problems, fmt.Sprintf("%s: type %s declares %d methods (at most %d)", declared[typ], typ.name, n, maxMethods))
		}
	}
	slices.Sort(problems)
	return problems
}

// receiverName is the type a method's receiver names: T of T, *T, T[P].
func receiverName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return receiverName(e.X)
	case *ast.IndexExpr:
		return receiverName(e.X)
	case *ast.IndexListExpr:
		return receiverName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
