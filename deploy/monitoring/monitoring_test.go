package monitoring

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// The metrics the daemon exports are the table of docs/operations.md: the
// end-to-end test TestMetricsAreDocumented holds that table to a running
// daemon with every feature on (and the names these files use to its
// /metrics).
const operationsDoc = "../../docs/operations.md"

// family is a documented metric family: its labels and its table row.
type family struct {
	labels    []string
	row       string
	histogram bool
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"instance", "job"}

// openLabels take values the table cannot list (CRI methods, the
// configured plugins, hosts, builds); the values of every other label are
// named in their metric's row.
var openLabels = []string{"service", "method", "plugin", "host", "hash", "version", "revision", "goversion", "cri_api"}

func documentedFamilies(t *testing.T) map[string]family {
	t.Helper()
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `((?:cri_image_proxy|rest_client)_[a-z_]+)` \\|([^|]*)\\|.*$")
	out := map[string]family{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		f := family{row: m[0], histogram: strings.Contains(m[0], "(histogram)")}
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				f.labels = append(f.labels, l)
			}
		}
		out[m[1]] = f
	}
	if len(out) < 25 {
		t.Fatalf("only %d metrics found in %s: its table changed shape", len(out), operationsDoc)
	}
	return out
}

// series is a metric name a query may select: a family, or a histogram's
// _bucket, _sum or _count series.
type series struct {
	name, family string
	labels       []string
}

func (s series) hasLabel(l string) bool { return slices.Contains(s.labels, l) }

func lookup(families map[string]family, name string) (series, error) {
	if f, ok := families[name]; ok {
		return series{name, name, append(slices.Clone(f.labels), targetLabels...)}, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		f, documented := families[base]
		if !ok || !documented {
			continue
		}
		if !f.histogram {
			return series{}, fmt.Errorf("%s: %s is documented, but not as a histogram", name, base)
		}
		ls := append(slices.Clone(f.labels), targetLabels...)
		if suffix == "_bucket" {
			ls = append(ls, "le")
		}
		return series{name, base, ls}, nil
	}
	return series{}, fmt.Errorf("%s is not a metric the daemon exports (docs/operations.md)", name)
}

var word = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkQuery parses expr with Prometheus's PromQL parser and checks that
// every metric it selects is exported, every label it matches, groups or
// joins on is one of those metrics' labels, and every label value it
// compares with is one the table names. It returns the metrics selected.
func checkQuery(families map[string]family, expr string) ([]string, []error) {
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, []error{err}
	}
	var errs []error
	selected := func(n parser.Node) []series {
		var out []series
		parser.Inspect(n, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				if s, err := lookup(families, vs.Name); err == nil {
					out = append(out, s)
				}
			}
			return nil
		})
		return out
	}
	anyHas := func(ss []series, l string) bool {
		return slices.ContainsFunc(ss, func(s series) bool { return s.hasLabel(l) })
	}
	var names []string
	parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				errs = append(errs, fmt.Errorf("%s: a selector without a metric name", n))
				return nil
			}
			s, err := lookup(families, n.Name)
			if err != nil {
				errs = append(errs, err)
				return nil
			}
			names = append(names, n.Name)
			for _, m := range n.LabelMatchers {
				switch {
				case m.Name == model.MetricNameLabel:
					if m.Type != labels.MatchEqual {
						errs = append(errs, fmt.Errorf("%s: the metric name is matched by %s", n, m.Type))
					}
				case !s.hasLabel(m.Name):
					errs = append(errs, fmt.Errorf("%s: %s has no label %q", n, s.family, m.Name))
				case slices.Contains(targetLabels, m.Name) || slices.Contains(openLabels, m.Name) || strings.HasPrefix(m.Value, "$"):
					// The target's own, an open set, or a dashboard variable.
				case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
					if !word.MatchString(m.Value) || !regexp.MustCompile(`\b`+m.Value+`\b`).MatchString(families[s.family].row) {
						errs = append(errs, fmt.Errorf("%s: %s=%q is not a value docs/operations.md names for %s", n, m.Name, m.Value, s.family))
					}
				}
			}
		case *parser.AggregateExpr:
			inner := selected(n.Expr)
			for _, l := range n.Grouping {
				if !anyHas(inner, l) {
					errs = append(errs, fmt.Errorf("%s: grouping by %q, a label none of its metrics has", n, l))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching == nil {
				return nil
			}
			both := append(selected(n.LHS), selected(n.RHS)...)
			for _, l := range n.VectorMatching.MatchingLabels {
				if !anyHas(both, l) {
					errs = append(errs, fmt.Errorf("%s: matching on %q, a label none of its metrics has", n, l))
				}
			}
		}
		return nil
	})
	return names, errs
}

func TestEveryQueryNamesOnlyWhatTheDaemonExports(t *testing.T) {
	t.Parallel()
	families := documentedFamilies(t)
	queries, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 30 {
		t.Fatalf("only %d queries found in the alerts and the dashboard", len(queries))
	}
	for _, q := range queries {
		names, errs := checkQuery(families, q.Expr)
		for _, err := range errs {
			t.Errorf("%s: %v\n\t%s", q.Where, err, q.Expr)
		}
		if len(errs) == 0 && len(names) == 0 {
			t.Errorf("%s: selects no metric: %s", q.Where, q.Expr)
		}
	}
}

// The checker itself: each kind of mistake it must catch.
func TestTheQueryCheckCatchesWhatTheDaemonDoesNotExport(t *testing.T) {
	t.Parallel()
	families := documentedFamilies(t)
	for _, tc := range []struct {
		name, expr string
		ok         bool
	}{
		{"a documented metric with a documented label value passes", `cri_image_proxy_credential_plugin_calls_total{result="timeout", plugin="ecr"}`, true},
		{"a documented histogram's buckets, by le, pass", `histogram_quantile(0.9, sum by (le, method) (rate(cri_image_proxy_request_duration_seconds_bucket[5m])))`, true},
		{"a misspelt metric fails", `cri_image_proxy_backend_upp == 0`, false},
		{"a metric of another exporter fails", `up{job="cri-image-proxy"} == 0`, false},
		{"_bucket of a metric that is not a histogram fails", `cri_image_proxy_backend_up_bucket`, false},
		{"a label the metric does not have fails", `cri_image_proxy_ensure_verification_pulls_total{plugin="x"}`, false},
		{"a label value the docs do not name fails", `cri_image_proxy_config_reloads_total{result="failed"}`, false},
		{"grouping by a label no metric has fails", `sum by (method) (cri_image_proxy_ensure_pod_grants)`, false},
		{"matching on a label no metric has fails", `cri_image_proxy_backend_up and on (plugin) cri_image_proxy_ensure_records_available`, false},
		{"a selector without a metric name fails", `{result="failed"}`, false},
		{"a metric name matched by a regular expression fails", `{__name__=~"cri_image_proxy_.+"}`, false},
		{"an expression that does not parse fails", `rate(cri_image_proxy_requests_total[5m]`, false},
	} {
		_, errs := checkQuery(families, tc.expr)
		if (len(errs) == 0) != tc.ok {
			t.Errorf("%s: %s: errors %v", tc.name, tc.expr, errs)
		}
	}
}

// runbookBase is where each alert's runbook_url points, followed by the
// anchor of the alert's heading.
const runbookBase = "https://github.com/cri-image-proxy/cri-image-proxy/blob/main/docs/operations.md#"

func TestTheAlertRules(t *testing.T) {
	t.Parallel()
	groups, errs := rulefmt.Parse(Alerts, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("alerts.yaml: %v", err)
	}
	if len(errs) > 0 {
		return
	}
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	families := documentedFamilies(t)
	queries, err := Queries()
	if err != nil {
		t.Fatal(err)
	}
	uses := map[string][]string{} // metric -> alerts
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				t.Errorf("rule %q is not an alert: the file holds alerts only", r.Record)
				continue
			}
			alerts = append(alerts, name)
			if !slices.Contains(queries, Query{Where: "alerts.yaml: " + name, Expr: r.Expr}) {
				t.Errorf("%s: Queries does not list its expression as Prometheus reads it", name)
			}
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("%s: severity %q, want critical, warning or info", name, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s annotation", name, a)
				}
			}
			if want := runbookBase + strings.ToLower(name); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", name, r.Annotations["runbook_url"], want)
			}
			if !strings.Contains(string(doc), "\n### "+name+"\n") {
				t.Errorf("%s: docs/operations.md has no heading ### %s saying what it means and what to do", name, name)
			}
			names, _ := checkQuery(families, r.Expr)
			for _, n := range names {
				uses[n] = append(uses[n], name)
			}
			// An annotation may only use labels the alert has.
			var have []series
			for _, n := range names {
				s, _ := lookup(families, n)
				have = append(have, s)
			}
			for _, m := range regexp.MustCompile(`\$labels\.([a-zA-Z_]+)`).FindAllStringSubmatch(r.Annotations["summary"]+r.Annotations["description"], -1) {
				if !slices.ContainsFunc(have, func(s series) bool { return s.hasLabel(m[1]) }) {
					t.Errorf("%s: its annotations use $labels.%s, which its metrics do not have", name, m[1])
				}
			}
		}
	}
	// Every heading under "## Alerts" is an alert of the file: no stale runbook.
	section := string(doc)
	if i := strings.Index(section, "\n## Alerts\n"); i >= 0 {
		section = section[i+len("\n## Alerts\n"):]
		if j := strings.Index(section, "\n## "); j >= 0 {
			section = section[:j]
		}
		for _, m := range regexp.MustCompile(`(?m)^### (\S+)$`).FindAllStringSubmatch(section, -1) {
			if !slices.Contains(alerts, m[1]) {
				t.Errorf("docs/operations.md documents the alert %s, which alerts.yaml does not have", m[1])
			}
		}
	} else {
		t.Error("docs/operations.md has no ## Alerts section")
	}
	// The states an operator must act on, each watched by some alert.
	for _, state := range []struct{ what, metric string }{
		{"the records database is unavailable", "cri_image_proxy_ensure_records_available"},
		{"records cannot be written", "cri_image_proxy_ensure_record_write_errors_total"},
		{"the runtime behind the proxy is down", "cri_image_proxy_backend_up"},
		{"the kubelet bypasses the proxy", "cri_image_proxy_client_last_call_timestamp_seconds"},
		{"a reload was refused", "cri_image_proxy_config_last_reload_successful"},
		{"credential plugins fail or time out", "cri_image_proxy_credential_plugin_calls_total"},
		{"verification pulls fail", "cri_image_proxy_ensure_verification_pulls_total"},
	} {
		if len(uses[state.metric]) == 0 {
			t.Errorf("no alert watches %s (%s)", state.what, state.metric)
		}
	}
}

func TestTheDashboard(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	panels, err := Panels()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	var rows []string
	type box struct{ x, y, w, h int }
	var boxes []box
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			if prev, ok := ids[p.ID]; ok || p.ID == 0 {
				t.Errorf("panel %q: id %d, already %q's", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			g := p.GridPos
			b := box{g.X, g.Y, g.W, g.H}
			if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, g)
			}
			for _, o := range boxes {
				if b.x < o.x+o.w && o.x < b.x+b.w && b.y < o.y+o.h && o.y < b.y+b.h {
					t.Errorf("panel %q at %+v overlaps another", p.Title, g)
				}
			}
			boxes = append(boxes, b)
			if p.Type == "row" {
				rows = append(rows, p.Title)
				walk(p.Panels)
				continue
			}
			if p.Title == "" || len(p.Targets) == 0 {
				t.Errorf("panel %d %q: no title or no query", p.ID, p.Title)
			}
			if !strings.Contains(string(p.Datasource), `"${datasource}"`) {
				t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %q: refId %q missing or repeated", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
			}
		}
	}
	walk(panels)
	if len(rows) < 5 || len(ids) < 25 {
		t.Errorf("%d rows, %d panels: the dashboard lost its content", len(rows), len(ids))
	}
	for _, r := range rows {
		if !strings.Contains(string(doc), "**"+r+"**") {
			t.Errorf("row %q is not described in docs/operations.md (as **%s**)", r, r)
		}
	}
}

// TestThePrometheusServerModuleStaysOutOfTheDaemon: these tests use
// Prometheus's parsers; the daemon must not link them.
func TestThePrometheusServerModuleStaysOutOfTheDaemon(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on the path to list the daemon's imports")
	}
	out, err := exec.Command(goTool, "list", "-deps", "../../cmd/cri-image-proxy").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/prometheus/prometheus/") {
			t.Errorf("the daemon imports %s", pkg)
		}
	}
	if !strings.Contains(string(out), "github.com/cri-image-proxy/cri-image-proxy/ensure") {
		t.Errorf("go list -deps gave no daemon packages:\n%s", out)
	}
}
