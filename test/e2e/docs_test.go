package e2e

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/cri-image-proxy/cri-image-proxy/deploy/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestMetricsAreDocumented scrapes a daemon with every feature on, after a
// pull through credential injection, an ensure decision, an image policy
// decision and a reload, and
// checks that docs/operations.md documents each metric it exports (and
// marks its histograms), and that every metric the shipped alerts and
// dashboard (deploy/monitoring) query is one it exports.
func TestMetricsAreDocumented(t *testing.T) {
	k := needKube(t)
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	plugins := newPluginSetup(t, map[string]string{"docs-creds": "alice:" + rig.Users["alice"]})
	mon := freeAddr(t)
	p := startEnsureProxy(t, "docs", append([]string{"--monitoring-address", mon, "--kubeconfig", kubeconfig, "--node-name", nodeName,
		"--image-credential-provider-config", plugins.config, "--image-credential-provider-bin-dir", plugins.binDir}, allowAllPolicy(t, "docs")...)...)
	img := testRig.Registry + "/" + rig.TeamBImage
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	tn := newTenant(t, "docs-tenant", "")
	if r := tn.pull(t, p.ep, img); r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Stderr)
	}
	crictl(t, p.ep, "inspecti", img)
	// An image pulled with a pod's own credentials, then looked up without
	// any: a must-verify decision (the injected pull above is node-wide).
	imgA := testRig.Registry + "/" + rig.TeamAImage
	crictl(t, direct(), "rmi", imgA)
	t.Cleanup(func() { crictl(t, direct(), "rmi", imgA) })
	if r := newTenant(t, "docs-tenant-a", "alice:"+rig.Users["alice"]).pull(t, p.ep, imgA); r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Stderr)
	}
	crictl(t, p.ep, "inspecti", imgA)
	if err := p.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var metrics string
	if err := rig.WaitFor("a reload", p.proc, 30*time.Second, func() error {
		if _, metrics = httpGet(t, mon, "/metrics"); !strings.Contains(metrics, "cri_image_proxy_config_reloads_total{") {
			return errors.New("no reload counted yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	families := regexp.MustCompile(`(?m)^# TYPE ((?:cri_image_proxy|rest_client)_[a-z_]+) `).FindAllStringSubmatch(metrics, -1)
	if len(families) < 15 {
		t.Fatalf("only %d families exported: %v", len(families), families)
	}
	for _, f := range families {
		if !strings.Contains(string(doc), "`"+f[1]+"`") {
			t.Errorf("docs/operations.md does not document %s", f[1])
		}
	}
	// The table marks histograms: deploy/monitoring's tests allow _bucket,
	// _sum and _count of those only.
	for _, f := range regexp.MustCompile(`(?m)^# TYPE ((?:cri_image_proxy|rest_client)_[a-z_]+) ([a-z]+)$`).FindAllStringSubmatch(metrics, -1) {
		row := regexp.MustCompile("(?m)^\\| `" + f[1] + "` \\|.*$").FindString(string(doc))
		if marked := strings.Contains(row, "(histogram)"); marked != (f[2] == "histogram") {
			t.Errorf("%s is a %s, and its row in docs/operations.md says (histogram): %v", f[1], f[2], marked)
		}
	}

	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]`).FindAllStringSubmatch(metrics, -1) {
		exported[m[1]] = true
	}
	// Vectors export nothing until their first value; this test makes
	// every other metric the alerts and dashboard use.
	notYet := map[string]string{
		"cri_image_proxy_credential_cache_evictions_total": "counted from the first eviction of a full cache",
	}
	queries, err := monitoring.Queries()
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, q := range queries {
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		for _, sel := range parser.ExtractSelectors(expr) {
			for _, m := range sel {
				if m.Name != model.MetricNameLabel {
					continue
				}
				used++
				if !exported[m.Value] && notYet[m.Value] == "" {
					t.Errorf("%s queries %s, which the daemon does not export", q.Where, m.Value)
				}
			}
		}
	}
	if used < 30 {
		t.Errorf("only %d metrics used by the alerts and the dashboard", used)
	}
}
