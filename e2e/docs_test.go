package e2e

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig"
)

// TestMetricsAreDocumented scrapes a daemon with every feature on, after a
// pull through credential injection and an ensure decision, and checks
// that docs/operations.md documents each metric it exports.
func TestMetricsAreDocumented(t *testing.T) {
	k := needKube(t)
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := k.WriteKubeconfig(proxyUser)
	if err != nil {
		t.Fatal(err)
	}
	plugins := newPluginSetup(t, map[string]string{"docs-creds": "alice:" + rig.Users["alice"]})
	mon := freeAddr(t)
	p := startEnsureProxy(t, "docs", "--monitoring-address", mon, "--kubeconfig", kubeconfig, "--node-name", nodeName,
		"--image-credential-provider-config", plugins.config, "--image-credential-provider-bin-dir", plugins.binDir)
	img := testRig.Registry + "/" + rig.TeamBImage
	t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	tn := newTenant(t, "docs-tenant", "")
	if r := tn.pull(t, p.ep, img); r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Stderr)
	}
	crictl(t, p.ep, "inspecti", img)

	_, metrics := httpGet(t, mon, "/metrics")
	families := regexp.MustCompile(`(?m)^# TYPE ((?:cri_image_proxy|rest_client)_[a-z_]+) `).FindAllStringSubmatch(metrics, -1)
	if len(families) < 15 {
		t.Fatalf("only %d families exported: %v", len(families), families)
	}
	for _, f := range families {
		if !strings.Contains(string(doc), "`"+f[1]+"`") {
			t.Errorf("docs/operations.md does not document %s", f[1])
		}
	}
}
