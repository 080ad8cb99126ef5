package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestRecordExpiry runs the optional maximum record age on the real
// proxy, containerd and registry: a credential verified for team-a (a
// 3-second age for its repository) is re-used with no registry request
// until it is older, then verified by the registry again, once; team-b
// (no age of its own, no default) is re-used for ever. records show
// --ages says when each credential was verified and whether it expired.
func TestRecordExpiry(t *testing.T) {
	needRig(t)
	const maxAge = 3 * time.Second
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	os.WriteFile(cfg, []byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\nensureSecretPulledImages:\n  enabled: true\n"+
		"  maxRecordAgeByRepository:\n    - pattern: "+testRig.Registry+"/team-a\n      maxAge: "+maxAge.String()+"\n"), 0o644)
	p := startEnsureProxy(t, "expiry", "--config", cfg)
	teamA, teamB := testRig.Registry+"/"+rig.TeamAImage, testRig.Registry+"/"+rig.TeamBImage
	for _, img := range []string{teamA, teamB} {
		crictl(t, direct(), "rmi", img)
		t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
	}
	user := "user:" + rig.Users["user"]
	first, second, third := newTenant(t, "expiry-1", user), newTenant(t, "expiry-2", user), newTenant(t, "expiry-3", user)

	if n := first.pullCountingRequests(t, p.ep, teamA); n == 0 {
		t.Fatalf("the first pull of team-a made no registry request")
	}
	verified := time.Now()
	first.pullCountingRequests(t, p.ep, teamB)
	if n := second.pullCountingRequests(t, p.ep, teamA); n != 0 && time.Since(verified) < maxAge {
		t.Errorf("a re-use within the maximum age made %d registry requests", n)
	}
	out, err := p.records(t, "show", teamA, "--ages")
	if err != nil || !strings.Contains(out, "3s") || !strings.Contains(out, "false") {
		t.Errorf("records show --ages within the age: %v\n%s", err, out)
	}

	// Past the age (waiting for it is the test: the clock is real).
	time.Sleep(maxAge + time.Second)
	if out, _ := p.records(t, "show", teamA, "--ages"); !strings.Contains(out, "true") {
		t.Errorf("records show --ages past the age does not say expired:\n%s", out)
	}
	if n := second.pullCountingRequests(t, p.ep, teamA); n == 0 {
		t.Errorf("a re-use past the maximum age made no registry request")
	}
	if n := third.pullCountingRequests(t, p.ep, teamA); n != 0 {
		t.Errorf("the pull right after the new verification made %d registry requests", n)
	}
	if n := third.pullCountingRequests(t, p.ep, teamB); n != 0 {
		t.Errorf("team-b, with no maximum age, made %d registry requests", n)
	}
	if !strings.Contains(p.proc.LogText(), "maximum record age") {
		t.Errorf("the proxy's log does not say why the registry verified again")
	}
}
