package docs

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode"
)

// The two blocks of architecture.md this file checks, each the fenced
// block right after its marker line.
const (
	architectureDoc = "architecture.md"
	layersMarker    = "<!-- layers: checked by docs/architecture_test.go -->"
	importsMarker   = "<!-- import map: checked by docs/architecture_test.go -->"
)

// The import map's form: one line per package, `PKG ─► DEP, DEP, ...`,
// or `PKG ─► nothing of ours`; a line that begins with a space continues
// the imports of the line above.
const (
	arrow     = "─►"
	nothing   = "nothing of ours"
	mapWidth  = 100 // where the import map as the code has it is wrapped
	mapIndent = "  "
)

// TestTheImportMapIsTheCodes holds the import map of architecture.md to
// the code: each package of the module has its line, listing exactly its
// non-test imports of the module (paths relative to the module, sorted),
// as `go list ./...` sees them. A failure names each wrong line, and logs
// the map as the code has it.
func TestTheImportMapIsTheCodes(t *testing.T) {
	g := moduleGraph(t)
	if report(t, importMapProblems(docBlock(t, importsMarker), g)) {
		t.Logf("the import map as the code has it:\n%s", renderImportMap(g))
	}
}

// TestTheLayersAreTheCodes holds the layers drawn in architecture.md to
// the code: every package of the module has a line, with its role, under
// the layer of its top folder; every folder is on one layer; and a
// package imports, out of its own folder, only folders on layers below
// its own. A folder drawn apart is imported by nothing of the module.
func TestTheLayersAreTheCodes(t *testing.T) {
	g := moduleGraph(t)
	report(t, layerProblems(docBlock(t, layersMarker), g))
}

// report fails the test with each problem, at its line of
// architecture.md, and says whether there was any.
func report(t *testing.T, problems []string) bool {
	t.Helper()
	for _, p := range problems {
		t.Errorf("%s:%s", architectureDoc, p)
	}
	return len(problems) > 0
}

// importMapProblems are the problems of an import map's lines: lines out
// of its form, and lines that differ from g.
func importMapProblems(lines []line, g graph) []string {
	entries, problems := parseImportMap(lines)
	return append(problems, checkImportMap(entries, g)...)
}

// layerProblems are the problems of a layers drawing's lines: lines out of
// its form, lines that differ from g, and imports that run up.
func layerProblems(lines []line, g graph) []string {
	d, problems := parseLayers(lines)
	return append(problems, checkLayers(d, g)...)
}

// graph is the module's packages, by path relative to the module, each
// with its non-test imports of the module, sorted.
type graph map[string][]string

var loadGraph = sync.OnceValues(func() (graph, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return nil, err
	}
	module, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the go command, to list the module's packages: %w", err)
	}
	cmd := exec.Command(goCmd, "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")
	cmd.Dir = root
	// Everything it needs is in the module cache already (the tests were
	// built from it): never the network.
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list ./... in %s: %w\n%s", root, err, stderr.String())
	}
	return parseGoList(module, string(out)), nil
})

func moduleGraph(t *testing.T) graph {
	t.Helper()
	g, err := loadGraph()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// modulePath reads the module's path off its go.mod.
func modulePath(goMod string) (string, error) {
	data, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	for l := range strings.Lines(string(data)) {
		if path, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			return strings.Trim(strings.TrimSpace(path), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", goMod)
}

// parseGoList reads go list's lines, a package and its imports each, into
// the module's graph.
func parseGoList(module, out string) graph {
	rel := func(p string) (string, bool) {
		if p == module {
			return ".", true
		}
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	g := graph{}
	for l := range strings.Lines(out) {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		pkg, _ := rel(f[0])
		deps := []string{}
		for _, imp := range f[1:] {
			if r, ok := rel(imp); ok {
				deps = append(deps, r)
			}
		}
		slices.Sort(deps)
		g[pkg] = deps
	}
	return g
}

// line is a line of architecture.md and its number.
type line struct {
	n    int
	text string
}

func docBlock(t *testing.T, marker string) []line {
	t.Helper()
	data, err := os.ReadFile(architectureDoc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fencedBlockAfter(string(data), marker)
	if err != nil {
		t.Fatalf("%s: %v", architectureDoc, err)
	}
	return b
}

// fencedBlockAfter returns the lines of the fenced block that follows the
// line marker in doc.
func fencedBlockAfter(doc, marker string) ([]line, error) {
	lines := strings.Split(doc, "\n")
	at := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == marker {
			if at >= 0 {
				return nil, fmt.Errorf("%q is there twice (lines %d and %d)", marker, at+1, i+1)
			}
			at = i
		}
	}
	if at < 0 {
		return nil, fmt.Errorf("no line %q: it marks the block this test checks", marker)
	}
	i := at + 1
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	if i == len(lines) || !strings.HasPrefix(lines[i], "```") {
		return nil, fmt.Errorf("line %d: a fenced block (```) must follow %q", at+1, marker)
	}
	var b []line
	for i++; i < len(lines); i++ {
		if strings.HasPrefix(lines[i], "```") {
			return b, nil
		}
		b = append(b, line{i + 1, lines[i]})
	}
	return nil, fmt.Errorf("line %d: the block after %q is not closed", at+1, marker)
}

// mapLine is a package's line of the import map.
type mapLine struct {
	n    int
	pkg  string
	deps []string
}

// parseImportMap reads the import map's lines; problems are lines not in
// its form.
func parseImportMap(lines []line) (entries []mapLine, problems []string) {
	for _, l := range lines {
		if strings.TrimSpace(l.text) == "" {
			continue
		}
		if l.text[0] == ' ' {
			if len(entries) == 0 || entries[len(entries)-1].deps == nil {
				problems = append(problems, fmt.Sprintf("%d: a continuation line with no list of imports above it: %q", l.n, l.text))
				continue
			}
			last := &entries[len(entries)-1]
			last.deps = append(last.deps, splitDeps(strings.TrimSpace(l.text))...)
			continue
		}
		pkg, deps, ok := strings.Cut(l.text, arrow)
		pkg, deps = strings.TrimSpace(pkg), strings.TrimSpace(deps)
		if !ok || pkg == "" || strings.ContainsAny(pkg, " ,") || deps == "" {
			problems = append(problems, fmt.Sprintf("%d: not `PKG %s DEP, DEP, ...` or `PKG %s %s`: %q", l.n, arrow, arrow, nothing, l.text))
			continue
		}
		e := mapLine{n: l.n, pkg: pkg}
		if deps != nothing {
			e.deps = splitDeps(deps)
		}
		entries = append(entries, e)
	}
	return entries, problems
}

// splitDeps splits "a, b," into its imports; a trailing comma, before a
// continuation line, is allowed.
func splitDeps(s string) []string {
	var deps []string
	for d := range strings.SplitSeq(strings.TrimSuffix(s, ","), ",") {
		deps = append(deps, strings.TrimSpace(d))
	}
	return deps
}

// checkImportMap compares the import map's lines with the code's graph
// and names each wrong line.
func checkImportMap(entries []mapLine, g graph) []string {
	var problems []string
	seen := map[string]int{}
	for i, e := range entries {
		if at, dup := seen[e.pkg]; dup {
			problems = append(problems, fmt.Sprintf("%d: %s is listed twice (also line %d)", e.n, e.pkg, at))
			continue
		}
		seen[e.pkg] = e.n
		if i > 0 && e.pkg < entries[i-1].pkg {
			problems = append(problems, fmt.Sprintf("%d: %s is out of order: the lines are sorted by package", e.n, e.pkg))
		}
		want, ok := g[e.pkg]
		if !ok {
			problems = append(problems, fmt.Sprintf("%d: extra line: %s is no package of the module", e.n, e.pkg))
			continue
		}
		for _, d := range want {
			if !slices.Contains(e.deps, d) {
				problems = append(problems, fmt.Sprintf("%d: %s: missing import %s (it imports it)", e.n, e.pkg, d))
			}
		}
		listed := map[string]bool{}
		for _, d := range e.deps {
			switch {
			case d == "":
				problems = append(problems, fmt.Sprintf("%d: %s: an empty import in the list", e.n, e.pkg))
			case listed[d]:
				problems = append(problems, fmt.Sprintf("%d: %s: import %s is listed twice", e.n, e.pkg, d))
			case !slices.Contains(want, d):
				problems = append(problems, fmt.Sprintf("%d: %s: extra import %s (it does not import it)", e.n, e.pkg, d))
			}
			listed[d] = true
		}
		if !slices.IsSorted(e.deps) {
			problems = append(problems, fmt.Sprintf("%d: %s: its imports are not sorted", e.n, e.pkg))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		if _, ok := seen[pkg]; !ok {
			problems = append(problems, fmt.Sprintf(" missing line for %s: %s", pkg, mapLineOf(pkg, g[pkg])))
		}
	}
	return problems
}

func mapLineOf(pkg string, deps []string) string {
	if len(deps) == 0 {
		return pkg + " " + arrow + " " + nothing
	}
	return pkg + " " + arrow + " " + strings.Join(deps, ", ")
}

// renderImportMap is the import map as the code has it, in the form
// parseImportMap reads: names aligned, imports wrapped at mapWidth.
func renderImportMap(g graph) string {
	pkgs := slices.Sorted(maps.Keys(g))
	width := 0
	for _, p := range pkgs {
		width = max(width, len([]rune(p)))
	}
	var b strings.Builder
	for _, p := range pkgs {
		head := p + strings.Repeat(" ", width-len([]rune(p))) + " " + arrow + " "
		col := len([]rune(head))
		b.WriteString(head)
		if len(g[p]) == 0 {
			b.WriteString(nothing + "\n")
			continue
		}
		at := col
		for i, d := range g[p] {
			word := d
			if i < len(g[p])-1 {
				word += ","
			}
			if i > 0 {
				if at+1+len(word) > mapWidth {
					b.WriteString("\n" + mapIndent + strings.Repeat(" ", col-len(mapIndent)))
					at = col
				} else {
					b.WriteString(" ")
					at++
				}
			}
			b.WriteString(word)
			at += len(word)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// drawing is the layers block: its layers, top first, and the packages
// drawn under them.
type drawing struct {
	layers []drawnLayer
	pkgs   []drawnPackage
}

type drawnLayer struct {
	n       int
	folders []string
	apart   bool // imported by nothing of the module
}

type drawnPackage struct {
	n     int
	pkg   string
	layer int // index in layers
}

// parseLayers reads the layers block: a line at the margin is a layer, its
// folders first (`cmd/ hack/  what they are`; `apart: deploy/ ...` for
// folders nothing imports); an indented line under it is a package of
// those folders and its role; a line with no letter is drawing.
func parseLayers(lines []line) (drawing, []string) {
	var d drawing
	var problems []string
	for _, l := range lines {
		if !strings.ContainsFunc(l.text, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) {
			continue
		}
		f := strings.Fields(l.text)
		if l.text[0] != ' ' {
			layer := drawnLayer{n: l.n}
			if f[0] == "apart:" {
				layer.apart, f = true, f[1:]
			}
			for _, w := range f {
				folder, ok := strings.CutSuffix(w, "/")
				if !ok {
					break
				}
				layer.folders = append(layer.folders, folder)
			}
			if len(layer.folders) == 0 {
				problems = append(problems, fmt.Sprintf("%d: a layer names its folders first (`cmd/ hack/  ...`): %q", l.n, l.text))
				continue
			}
			d.layers = append(d.layers, layer)
			continue
		}
		switch {
		case len(d.layers) == 0:
			problems = append(problems, fmt.Sprintf("%d: a package before the first layer: %q", l.n, l.text))
		case len(f) < 2:
			problems = append(problems, fmt.Sprintf("%d: %s: no role: a package's line says what it is for", l.n, f[0]))
		default:
			d.pkgs = append(d.pkgs, drawnPackage{n: l.n, pkg: f[0], layer: len(d.layers) - 1})
		}
	}
	return d, problems
}

// folderOf is a package's top folder.
func folderOf(pkg string) string {
	f, _, _ := strings.Cut(pkg, "/")
	return f
}

// checkLayers compares the drawing with the code's graph and names each
// wrong line, and each import that runs up.
func checkLayers(d drawing, g graph) []string {
	var problems []string
	layerOf := map[string]int{}
	for i, l := range d.layers {
		for _, f := range l.folders {
			if j, dup := layerOf[f]; dup {
				problems = append(problems, fmt.Sprintf("%d: %s/ is on two layers (also line %d)", l.n, f, d.layers[j].n))
				continue
			}
			layerOf[f] = i
		}
	}
	holds := map[string]bool{}
	for pkg := range g {
		holds[folderOf(pkg)] = true
	}
	for _, l := range d.layers {
		for _, f := range l.folders {
			if !holds[f] {
				problems = append(problems, fmt.Sprintf("%d: %s/ holds no package of the module", l.n, f))
			}
		}
	}
	drawn := map[string]int{}
	for _, p := range d.pkgs {
		if at, dup := drawn[p.pkg]; dup {
			problems = append(problems, fmt.Sprintf("%d: %s is drawn twice (also line %d)", p.n, p.pkg, at))
			continue
		}
		drawn[p.pkg] = p.n
		if _, ok := g[p.pkg]; !ok {
			problems = append(problems, fmt.Sprintf("%d: %s is no package of the module", p.n, p.pkg))
			continue
		}
		if f := folderOf(p.pkg); !slices.Contains(d.layers[p.layer].folders, f) {
			problems = append(problems, fmt.Sprintf("%d: %s is drawn on the layer of %s/, and its folder is %s/", p.n, p.pkg, strings.Join(d.layers[p.layer].folders, "/, "), f))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		if _, ok := drawn[pkg]; !ok {
			problems = append(problems, fmt.Sprintf(" %s has no line: draw it, with its role, on the layer of %s/", pkg, folderOf(pkg)))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(g)) {
		from := folderOf(pkg)
		lf, ok := layerOf[from]
		if !ok {
			continue // named above
		}
		n := drawn[pkg]
		if n == 0 {
			n = d.layers[lf].n
		}
		for _, dep := range g[pkg] {
			to := folderOf(dep)
			lt, ok := layerOf[to]
			switch {
			case from == to || !ok:
			case d.layers[lt].apart:
				problems = append(problems, fmt.Sprintf("%d: %s imports %s, and %s/ is drawn apart (line %d): nothing of the module imports it", n, pkg, dep, to, d.layers[lt].n))
			case lt <= lf:
				problems = append(problems, fmt.Sprintf("%d: %s imports %s, and %s/ (line %d) is not on a layer below %s/ (line %d)", n, pkg, dep, to, d.layers[lt].n, from, d.layers[lf].n))
			}
		}
	}
	return problems
}
