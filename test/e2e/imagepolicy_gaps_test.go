package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/signtest"
)

// The registry names of TestImagePolicyWithoutGaps. Each is mapped by its
// own hosts.toml to the rig's anonymous registry, as a node's
// configuration maps a registry's names: containerd and the proxy's
// registry check reach all of them as the one server. gapsHost is the
// name the policy covers; the upper-case and :443 spellings are that
// registry as the runtime reaches it (on loopback a hosts.toml stands for
// what DNS and https's default port do in production); the alias is
// another name of it that no provider names.
const (
	gapsHost      = "gaps.rig.test"
	gapsUpper     = "GAPS.RIG.TEST"
	gapsPort443   = "gaps.rig.test:443"
	gapsUpper443  = "Gaps.Rig.Test:443"
	gapsAlias     = "alias.rig.test"
	gapsDeny      = "gaps-deny" // noMatchPolicy Deny
	gapsWarn      = "gaps-warn" // noMatchPolicy Warn
	gapsSigned    = "gaps-sig"  // noMatchPolicy Allow (the default)
	gapsOtherNS   = "gaps-other"
	gapsPluginKey = "sigstore-image-policy"
)

// TestImagePolicyWithoutGaps: a namespace's policy holds for every
// name the runtime reaches its registry by, and a namespace can refuse
// what no provider covers, with ensure on and off, on this leg's
// containerd:
//   - in a namespace requiring a signature (noMatchPolicy Allow), an
//     unsigned image named GAPS.RIG.TEST/..., gaps.rig.test:443/... or
//     Gaps.Rig.Test:443/... is refused at pull by the plugin as
//     gaps.rig.test/... is, and at create by that name and by ID once on
//     the node; a signed one runs under every spelling;
//   - a Deny namespace refuses an image of a registry no provider names (a
//     DNS alias of the covered registry, its IP address), signed or not, at
//     pull (the runtime never pulls it) and at create by name and by ID,
//     and runs a signed image of the covered registry;
//   - a Warn namespace runs such an image, and the daemon counts it
//     (no_provider_warned) and logs a warning;
//   - the key removed from the plugin's policy file refuses the next
//     create of an image whose allow was cached at its pull, with no
//     SIGHUP and no reload.
func TestImagePolicyWithoutGaps(t *testing.T) {
	needRig(t)
	plugin, err := buildSigstorePlugin()
	if err != nil {
		t.Fatal(err)
	}
	anonPort, err := strconv.Atoi(testRig.AnonRegistry[strings.LastIndexByte(testRig.AnonRegistry, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{gapsHost, gapsUpper, gapsPort443, gapsUpper443, gapsAlias} {
		if err := testRig.AddMirror(host, anonPort); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testRig.RemoveMirror(host) })
	}

	ps := &policySetup{dir: filepath.Join(testRig.Dir, "image-policy-gaps")}
	ps.binDir = filepath.Join(ps.dir, "bin")
	if err := os.MkdirAll(ps.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	ps.write(t, "bin/"+gapsPluginKey, string(data), 0o755)
	key, other := newKeyPair(t), newKeyPair(t)
	ps.key = key
	release := ps.write(t, "release.pub", string(key.PublicKeyPEM()), 0o644)
	otherPub := ps.write(t, "other.pub", string(other.PublicKeyPEM()), 0o644)
	// The plugin's policy: the covered registry's name is reached at the
	// anonymous registry (the plugin's own setting, as containerd's
	// hosts.toml is the runtime's); the namespaces take the release key.
	writePolicy := func(keyName, keyPath string) string {
		return ps.write(t, "sigstore-policy.yaml", fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
registries: [{host: %s, endpoint: "http://%s"}]
policies:
  - name: signed
    namespaces: [%s, %s, %s]
    authorities: [{name: %s, key: {path: %q}}]
`, gapsHost, testRig.AnonRegistry, gapsSigned, gapsDeny, gapsWarn, keyName, keyPath), 0o644)
	}
	policy := writePolicy("release-key", release)
	// No watchFiles: the policy file, an absolute path among the args, is
	// watched.
	ps.config = ps.write(t, "image-policy.yaml", fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
noMatchPolicy:
  namespaces: {%s: Deny, %s: Warn}
providers:
  - name: %s
    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1
    matchImages: [%q]
    namespaces: [%s, %s, %s]
    args: ["--policy", %q]
`, gapsDeny, gapsWarn, gapsPluginKey, gapsHost, gapsSigned, gapsDeny, gapsWarn, policy), 0o644)

	signed := push(t, "gaps/signed:v1", "gaps-signed")
	signWithKey(t, signed, key)
	push(t, "gaps/unsigned:v1", "gaps-unsigned")
	name := func(host, image string) string { return host + "/gaps/" + image + ":v1" }
	var names []string
	for _, host := range []string{gapsHost, gapsUpper, gapsPort443, gapsUpper443, gapsAlias, testRig.AnonRegistry} {
		names = append(names, name(host, "signed"), name(host, "unsigned"))
	}
	rmi := func() {
		for _, n := range names {
			crictl(t, direct(), "rmi", n)
		}
	}
	t.Cleanup(rmi)

	for _, mode := range policyModes(ps.dir) {
		t.Run(mode.name, func(t *testing.T) {
			rmi()
			writePolicy("release-key", release)
			slug := strings.ReplaceAll(mode.name, " ", "-")
			mon := freeAddr(t)
			ep, proc := startProxy(t, "gaps-"+slug, append(mode.flags, append(ps.flags(), "--monitoring-address", mon)...)...)
			pod := func(ns, n string) policyPod { return newPolicyPod(t, ns, "gaps-"+n+"-"+slug) }
			refusedAtCreate := func(t *testing.T, p policyPod, sandbox, ref, reason string) {
				t.Helper()
				err := p.container(t, ep, sandbox, ref, "")
				if err == nil || !strings.Contains(err.Error(), "create:") || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), reason) {
					t.Errorf("a container of %s: %v, want refused at create with %q", ref, err, reason)
				}
			}

			t.Run("every spelling of the covered registry is decided as it is, at pull and at create", func(t *testing.T) {
				p := pod(gapsSigned, "spell")
				for _, host := range []string{gapsHost, gapsUpper, gapsPort443, gapsUpper443} {
					img := name(host, "unsigned")
					refusedByPolicy(t, img, p.pull(t, ep, img), "image is not signed")
					// Without ensure the policy decides before the runtime pulls;
					// with it, beside the runtime's pull, whose leftover is
					// refused at create (below, by name and by ID).
					if r := crictl(t, direct(), "inspecti", img); r.Err == nil && mode.name == "ensure off" {
						t.Errorf("the runtime pulled %s, refused", img)
					}
				}
				// On the node by another namespace's pull, under a spelling:
				// refused at create by that name and by ID.
				present := name(gapsUpper443, "unsigned")
				if r := pod(gapsOtherNS, "spell-other").pull(t, ep, present); r.Err != nil {
					t.Fatalf("another namespace's pull of %s: %v\n%s", present, r.Err, r.Stderr)
				}
				sandbox := p.sandbox(t, ep)
				for _, ref := range []string{present, imageID(t, present)} {
					refusedAtCreate(t, p, sandbox, ref, "image is not signed")
				}
				for _, host := range []string{gapsUpper, gapsPort443} {
					img := name(host, "signed")
					if r := p.pull(t, ep, img); r.Err != nil {
						t.Fatalf("the signed pull of %s: %v\n%s", img, r.Err, r.Stderr)
					}
					if err := p.container(t, ep, sandbox, img, "gaps-signed"); err != nil {
						t.Errorf("a container of %s: %v", img, err)
					}
				}
			})

			t.Run("a Deny namespace refuses an image of a registry no provider names, and runs a signed one", func(t *testing.T) {
				p := pod(gapsDeny, "deny")
				reason := `no image policy covers this image, and namespace "` + gapsDeny + `" runs only images a policy covers`
				for _, img := range []string{name(gapsAlias, "signed"), name(testRig.AnonRegistry, "unsigned")} {
					refusedByPolicy(t, img, p.pull(t, ep, img), reason)
					if r := crictl(t, direct(), "inspecti", img); r.Err == nil {
						t.Errorf("the runtime pulled %s, refused", img)
					}
				}
				alias := name(gapsAlias, "unsigned")
				if r := pod(gapsOtherNS, "deny-other").pull(t, ep, alias); r.Err != nil {
					t.Fatalf("another namespace's pull of %s: %v\n%s", alias, r.Err, r.Stderr)
				}
				sandbox := p.sandbox(t, ep)
				refusedAtCreate(t, p, sandbox, alias, reason)
				// By ID the image is decided as each repository the runtime
				// lists it under: here also a covered spelling (the first
				// subtest's), whose plugin refuses it first.
				refusedAtCreate(t, p, sandbox, imageID(t, alias), "refused by image policy")
				img := name(gapsHost, "signed")
				if r := p.pull(t, ep, img); r.Err != nil {
					t.Fatalf("the signed pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.container(t, ep, sandbox, img, "gaps-signed"); err != nil {
					t.Errorf("the signed container: %v", err)
				}
			})

			t.Run("a Warn namespace runs an image no provider covers, counts it and logs it", func(t *testing.T) {
				p := pod(gapsWarn, "warn")
				img := name(gapsAlias, "unsigned")
				if r := p.pull(t, ep, img); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.run(t, ep, img, "gaps-unsigned"); err != nil {
					t.Fatal(err)
				}
				_, metrics := httpGet(t, mon, "/metrics")
				for _, call := range []string{"PullImage", "CreateContainer"} {
					if n := metricValue(metrics, `cri_image_proxy_image_policy_decisions_total{call="`+call+`",provider="",result="no_provider_warned",source=""}`); n < 1 {
						t.Errorf("%s: no_provider_warned decisions %v, want counted:\n%s", call, n, grepLines(metrics, "image_policy_decisions_total"))
					}
				}
				if !strings.Contains(proc.LogText(), "allowed by the namespace's noMatchPolicy Warn") {
					t.Errorf("no warning in the log")
				}
			})

			t.Run("a key removed from the plugin's policy refuses the next create, with no SIGHUP", func(t *testing.T) {
				p := pod(gapsSigned, "revoke")
				img := name(gapsHost, "signed")
				if r := p.pull(t, ep, img); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				sandbox := p.sandbox(t, ep)
				if err := p.container(t, ep, sandbox, img, "gaps-signed"); err != nil {
					t.Fatalf("before the change: %v", err)
				}
				_, before := httpGet(t, mon, "/metrics")
				changes := metricValue(before, `cri_image_proxy_image_policy_watched_file_changes_total{provider="`+gapsPluginKey+`"}`)
				writePolicy("other-key", otherPub)
				waitUntil(t, 30*time.Second, func() error {
					_, m := httpGet(t, mon, "/metrics")
					if n := metricValue(m, `cri_image_proxy_image_policy_watched_file_changes_total{provider="`+gapsPluginKey+`"}`); n <= changes {
						return fmt.Errorf("no change of the plugin's files seen yet (%v)", n)
					}
					return nil
				})
				refusedAtCreate(t, p, sandbox, img, "no valid signature")
				_, after := httpGet(t, mon, "/metrics")
				if n := metricValue(after, `cri_image_proxy_config_reloads_total{result="applied"}`) + metricValue(after, `cri_image_proxy_config_reloads_total{result="refused"}`); n != 0 {
					t.Errorf("%v configuration reloads: the plugin's file is not the configuration", n)
				}
				if !strings.Contains(proc.LogText(), "image policy: a file of the plugin changed; its cached verdicts are dropped") {
					t.Errorf("the log does not say the verdicts were dropped")
				}
			})

			t.Run("records explain --namespace shows the namespace's noMatchPolicy and the watched file", func(t *testing.T) {
				if mode.flags == nil {
					t.Skip("n/a: the admin socket is ensure's")
				}
				out, err := runProxyCLI("records", "explain", name(gapsAlias, "unsigned"), "--namespace", gapsDeny,
					"--admin-socket", filepath.Join(ps.dir, "admin.sock"), "--runtime-endpoint", direct())
				for _, want := range []string{"noMatchPolicy of namespace " + gapsDeny + " (an image no provider applies to): Deny",
					`refused: no provider applies, and namespace "` + gapsDeny + `"'s noMatchPolicy is Deny`, "a change of " + policy + " drops its cached verdicts (taken from its args)"} {
					if err != nil || !strings.Contains(out, want) {
						t.Errorf("records explain: %v, output lacks %q:\n%s", err, want, out)
					}
				}
				t.Logf("records explain:\n%s", out)
			})
		})
	}
}

// newKeyPair is a signing key of the tests.
func newKeyPair(t *testing.T) *signtest.Key {
	t.Helper()
	k, err := signtest.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// metricValue is the value of one series of a Prometheus text exposition,
// given as it is printed (name and labels in order); 0 when absent.
func metricValue(metrics, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(metrics)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// grepLines are the lines of s holding sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// runProxyCLI runs the proxy's command line, its output and error.
func runProxyCLI(args ...string) (string, error) {
	out, err := exec.Command(proxyBin, args...).CombinedOutput()
	return string(out), err
}
