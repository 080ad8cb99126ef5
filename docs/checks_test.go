package docs

import (
	"slices"
	"strings"
	"testing"
)

// lines numbers the lines of a block from 1.
func lines(block string) []line {
	var ls []line
	for i, l := range strings.Split(strings.TrimPrefix(block, "\n"), "\n") {
		ls = append(ls, line{i + 1, l})
	}
	return ls
}

// checkCase is a block, and the problems a check finds in it, in order.
type checkCase struct {
	name  string
	block string
	want  []string
}

// runChecks runs check on each case's block, held to small.
func runChecks(t *testing.T, check func([]line, graph) []string, cases []checkCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := check(lines(tc.block), small); !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// small is the graph the checks' own tests hold their blocks to.
var small = graph{
	"cmd/tool":      {"core", "internal/leaf"},
	"core":          {"internal/leaf"},
	"core/sub":      {"core"},
	"internal/leaf": {},
}

func TestTheImportMapCheckNamesEachWrongLine(t *testing.T) {
	runChecks(t, importMapProblems, []checkCase{
		{"the code's own map has no problem", `
cmd/tool      ─► core, internal/leaf
core          ─► internal/leaf
core/sub      ─► core
internal/leaf ─► nothing of ours`, nil},
		{"a continuation line continues the imports above", `
cmd/tool      ─► core,
                 internal/leaf
core          ─► internal/leaf
core/sub      ─► core
internal/leaf ─► nothing of ours`, nil},
		{"a missing and an extra import are named with their line", `
cmd/tool      ─► core, internal/leaf
core          ─► core/sub
core/sub      ─► core
internal/leaf ─► nothing of ours`, []string{
			"2: core: missing import internal/leaf (it imports it)",
			"2: core: extra import core/sub (it does not import it)",
		}},
		{"a package without a line is named, with the line it needs", `
cmd/tool      ─► core, internal/leaf
core/sub      ─► core
internal/leaf ─► nothing of ours`, []string{
			" missing line for core: core ─► internal/leaf",
		}},
		{"a line for no package is named", `
cmd/tool      ─► core, internal/leaf
core          ─► internal/leaf
core/gone     ─► core
core/sub      ─► core
internal/leaf ─► nothing of ours`, []string{
			"3: extra line: core/gone is no package of the module",
		}},
		{"a line out of its form is named", `
cmd/tool      ─► core, internal/leaf
core          -> internal/leaf
core/sub      ─► core
internal/leaf ─► nothing of ours`, []string{
			`2: not ` + "`PKG ─► DEP, DEP, ...` or `PKG ─► nothing of ours`" + `: "core          -> internal/leaf"`,
			" missing line for core: core ─► internal/leaf",
		}},
		{"unsorted lines and imports, and a package twice, are named", `
cmd/tool      ─► internal/leaf, core
core/sub      ─► core
core          ─► internal/leaf
core          ─► internal/leaf
internal/leaf ─► nothing of ours`, []string{
			"1: cmd/tool: its imports are not sorted",
			"3: core is out of order: the lines are sorted by package",
			"4: core is listed twice (also line 3)",
		}},
	})
}

func TestTheImportMapAsTheCodeHasItPassesItsOwnCheck(t *testing.T) {
	if problems := importMapProblems(lines(renderImportMap(small)), small); len(problems) > 0 {
		t.Errorf("the rendered map:\n%s\nproblems: %q", renderImportMap(small), problems)
	}
}

func TestTheLayersCheckNamesEachWrongLineAndEachImportUp(t *testing.T) {
	runChecks(t, layerProblems, []checkCase{
		{"the code's own layers have no problem", `
cmd/         the binaries
  cmd/tool   a tool
     │
core/
  core       the core
  core/sub   a part of it
internal/    the leaves
  internal/leaf  a leaf`, nil},
		{"an import up a layer is named", `
cmd/
  cmd/tool   a tool
internal/
  internal/leaf  a leaf
core/
  core       the core
  core/sub   a part of it`, []string{
			"6: core imports internal/leaf, and internal/ (line 3) is not on a layer below core/ (line 5)",
		}},
		{"a package without a line or a role, and a line for no package, are named", `
cmd/
  cmd/tool   a tool
  cmd/gone   gone
core/
  core
internal/
  internal/leaf  a leaf`, []string{
			"5: core: no role: a package's line says what it is for",
			"3: cmd/gone is no package of the module",
			" core has no line: draw it, with its role, on the layer of core/",
			" core/sub has no line: draw it, with its role, on the layer of core/",
		}},
		{"a package under another folder's layer is named", `
cmd/
  cmd/tool   a tool
core/
  core       the core
  core/sub   a part of it
  internal/leaf  a leaf
internal/`, []string{
			"6: internal/leaf is drawn on the layer of core/, and its folder is internal/",
		}},
		{"a folder drawn apart that something imports is named", `
cmd/
  cmd/tool   a tool
core/
  core       the core
  core/sub   a part of it
apart: internal/
  internal/leaf  a leaf`, []string{
			"2: cmd/tool imports internal/leaf, and internal/ is drawn apart (line 6): nothing of the module imports it",
			"4: core imports internal/leaf, and internal/ is drawn apart (line 6): nothing of the module imports it",
		}},
	})
}
