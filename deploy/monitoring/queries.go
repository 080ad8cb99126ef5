package monitoring

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// Alerts is alerts.yaml: a Prometheus rule file.
//
//go:embed alerts.yaml
var Alerts []byte

// Dashboard is dashboard.json: a Grafana dashboard.
//
//go:embed dashboard.json
var Dashboard []byte

// Query is one PromQL expression of the alerts or the dashboard.
type Query struct {
	// Where names it: "alerts.yaml: CRIImageProxyRuntimeDown",
	// `dashboard.json: panel "Runtime" query A`.
	Where string
	// Expr is the expression, with Grafana's interval variables
	// ($__rate_interval, ...) made a duration so that it parses; other
	// variables ($instance) only appear in label values, which they leave
	// valid.
	Expr string
}

// Queries lists every expression of Alerts and Dashboard: each rule's,
// each panel target's (rows' panels included) and each query variable's
// (label_values(QUERY, LABEL) gives QUERY).
func Queries() ([]Query, error) {
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert  string `json:"alert"`
				Record string `json:"record"`
				Expr   string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(Alerts, &rules); err != nil {
		return nil, fmt.Errorf("alerts.yaml: %w", err)
	}
	var out []Query
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out = append(out, Query{Where: "alerts.yaml: " + r.Alert + r.Record, Expr: r.Expr})
		}
	}
	var d dashboard
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Where: fmt.Sprintf("dashboard.json: panel %q query %s", p.Title, t.RefID), Expr: grafanaIntervals.Replace(t.Expr)})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := v.QueryText()
		if err != nil {
			return nil, fmt.Errorf("dashboard.json: variable %s: %w", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			return nil, fmt.Errorf("dashboard.json: variable %s: %q is not label_values(QUERY, LABEL)", v.Name, q)
		}
		out = append(out, Query{Where: "dashboard.json: variable " + v.Name, Expr: m[1]})
	}
	return out, nil
}

// Panels decodes the dashboard's panels, rows and their panels in order.
func Panels() ([]Panel, error) {
	var d dashboard
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard.json: %w", err)
	}
	return d.Panels, nil
}

// Panel is what the tests read of a Grafana panel.
type Panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	// Panels are a collapsed row's.
	Panels []Panel `json:"panels"`
}

type dashboard struct {
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// QueryText is the variable's query: Grafana writes it as a string or,
// for Prometheus since Grafana 9, as {"query": "..."}.
func (v variable) QueryText() (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", err
	}
	return o.Query, nil
}

var (
	labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)
	// Grafana's interval variables, which stand where PromQL wants a
	// duration; any duration parses the same.
	grafanaIntervals = strings.NewReplacer(
		"${__rate_interval}", "5m", "$__rate_interval", "5m",
		"${__interval}", "5m", "$__interval", "5m",
		"${__range}", "5m", "$__range", "5m",
	)
)
