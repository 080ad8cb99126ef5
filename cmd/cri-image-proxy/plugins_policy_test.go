package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// policyPlugins writes a bin directory with two policy plugins and a
// configuration: "signatures" (namespace secure, registry.test, sent the
// credential) allows only digest aaa…, and records what it got;
// "elsewhere" applies to namespace other only.
func policyPlugins(t *testing.T) (config, bin, requestFile string) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, "bin")
	requestFile = filepath.Join(dir, "request.json")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	const v = policyapi.V1alpha1
	plugin := `req=$(cat); printf '%s' "$req" > "` + requestFile + `"
case "$req" in
*'"digest":"sha256:aaaa'*) echo '{"apiVersion":"` + v + `","kind":"ImagePolicyResponse","allowed":true,"reason":"signed by release-key"}';;
*) echo '{"apiVersion":"` + v + `","kind":"ImagePolicyResponse","allowed":false,"reason":"no signature of release-key","podReason":"image is not signed"}';;
esac
`
	for _, name := range []string{"signatures", "elsewhere"} {
		testkit.WritePlugin(t, bin, name, plugin)
	}
	config = filepath.Join(dir, "policy.yaml")
	err := os.WriteFile(config, []byte(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
defaultNamespace: node
noMatchPolicy:
  namespaces: {locked: Deny, staging: Warn}
providers:
  - name: signatures
    apiVersion: `+v+`
    matchImages: [registry.test]
    namespaces: [secure]
    sendCredentials: true
  - name: elsewhere
    apiVersion: `+v+`
    matchImages: [registry.test]
    namespaces: [other]
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return config, bin, requestFile
}

func TestPluginsTestImagePolicy(t *testing.T) {
	t.Parallel()
	config, bin, requestFile := policyPlugins(t)
	flags := []string{"--image-policy-config", config, "--image-policy-bin-dir", bin}
	signed := "registry.test/team/app@sha256:" + strings.Repeat("a", 64)
	unsigned := "registry.test/team/app@sha256:" + strings.Repeat("b", 64)
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr bool
		want    []string
	}{
		{"a signed image is allowed, with the provider's reason", []string{signed, "--namespace", "secure"}, false, []string{
			"provider signatures: applies", "provider elsewhere: does not apply: namespace \"secure\" is not in its namespaces (other)",
			"provider signatures allowed\n  reason: signed by release-key\n  the daemon would cache it for 1h0m0s", "verdict: allowed"}},
		{"an unsigned image is refused, with both reasons, and the command fails", []string{unsigned, "--namespace", "secure"}, true, []string{
			"provider signatures refused\n  reason: no signature of release-key", "the pod would see: image is not signed", "verdict: REFUSED (image is not signed)"}},
		{"a tag with --digest is asked with that digest", []string{"registry.test/team/app:v1", "--digest", "sha256:" + strings.Repeat("a", 64), "--namespace", "secure"}, false, []string{"verdict: allowed"}},
		{"a namespace no provider covers is allowed", []string{unsigned, "--namespace", "free"}, false, []string{"verdict: allowed: no provider applies", `namespace "free"'s noMatchPolicy (an image no provider applies to): Allow`}},
		{"an image no provider covers is refused in a Deny namespace, and the command fails", []string{"REGISTRY.TEST:5000/team/app@sha256:" + strings.Repeat("a", 64), "--namespace", "locked"}, true, []string{
			`no image policy provider applies to namespace "locked" and repository registry.test:5000/team/app; the namespace's noMatchPolicy is Deny: refused`,
			`verdict: REFUSED (no image policy covers this image, and namespace "locked" runs only images a policy covers)`}},
		{"an image no provider covers is allowed with a warning in a Warn namespace", []string{"mirror.test/team/app@sha256:" + strings.Repeat("a", 64), "--namespace", "staging"}, false, []string{
			"verdict: allowed with a warning: no provider applies"}},
		{"another spelling of a covered registry gets its providers", []string{"REGISTRY.TEST:443/team/app@sha256:" + strings.Repeat("b", 64), "--namespace", "secure"}, true, []string{
			"the providers get repository registry.test:443/team/app", "provider signatures: applies", "verdict: REFUSED (image is not signed)"}},
		{"a tag without a digest is an error saying what to give", []string{"registry.test/team/app:v1", "--namespace", "secure"}, true, nil},
		{"an image ID at create gets every provider of the namespace", []string{"sha256:" + strings.Repeat("c", 64), "--image-id", "sha256:" + strings.Repeat("c", 64), "--call", "CreateContainer", "--namespace", "secure"}, true, []string{
			"repository (none: known by ID only)", "provider signatures: applies (the image is known by ID only"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCLI(t, append(append([]string{"plugins", "test"}, tc.args...), flags...)...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v; output:\n%s", err, tc.wantErr, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}

	t.Run("the password is read from stdin, given to the plugin, and shown nowhere", func(t *testing.T) {
		var outBuf strings.Builder
		root := newRootCmd()
		root.SetOut(&outBuf)
		root.SetErr(&outBuf)
		root.SetIn(strings.NewReader("s3cret-pw\n"))
		root.SetArgs(append([]string{"plugins", "test", signed, "--namespace", "secure", "--username", "tenant-a", "--password-stdin"}, flags...))
		if err := root.Execute(); err != nil {
			t.Fatalf("%v\n%s", err, outBuf.String())
		}
		b, err := os.ReadFile(requestFile)
		if err != nil {
			t.Fatal(err)
		}
		req, err := policyapi.DecodeRequest(b)
		if err != nil || req.Credential == nil || req.Credential.Password != "s3cret-pw" || req.Pod.Namespace != "secure" {
			t.Errorf("the plugin got %+v (%v)", req, err)
		}
		if strings.Contains(outBuf.String(), "s3cret-pw") {
			t.Errorf("the output shows the password:\n%s", outBuf.String())
		}
	})
}

func TestPluginsValidateImagePolicy(t *testing.T) {
	t.Parallel()
	config, bin, _ := policyPlugins(t)
	out, err := runCLI(t, "plugins", "validate", "--image-policy-config", config, "--image-policy-bin-dir", bin)
	if err != nil || !strings.Contains(out, "valid: 2 image policy provider(s)") || !strings.Contains(out, "pulls without a pod are decided for namespace node") ||
		!strings.Contains(out, "noMatchPolicy (an image no provider applies to): Allow by default, Deny in locked, Warn in staging") ||
		!strings.Contains(out, "provider signatures: no file watched (taken from its args)") {
		t.Errorf("err %v, output:\n%s", err, out)
	}
	if out, err := runCLI(t, "plugins", "validate", "--image-policy-config", config, "--image-policy-bin-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no executable") {
		t.Errorf("missing executables: err %v, output:\n%s", err, out)
	}
}

// TestPrintPolicyExplanation: records explain --namespace prints, for each
// repository the image is decided as, the namespace's noMatchPolicy, each
// provider's part with the files whose change drops its verdicts, and the
// verdict.
func TestPrintPolicyExplanation(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printPolicyExplanation(&b, &decision.PolicyExplanation{Image: "mirror.test/app:v1", As: []decision.PolicyDecidedAs{{
		Repository: "mirror.test/app",
		Explanation: imagepolicy.Explanation{Namespace: "locked", ConfigHash: "sha256:abc", NoMatchPolicy: imagepolicy.NoMatchDeny,
			Verdict: `refused: no provider applies, and namespace "locked"'s noMatchPolicy is Deny`,
			Providers: []imagepolicy.ProviderExplanation{{Provider: "sigstore-image-policy", Why: "repository mirror.test/app matches none of its matchImages (registry.test)",
				WatchFiles: []string{"/etc/cri-image-proxy/sigstore-policy.yaml"}, WatchFilesFromArgs: true}},
		},
	}}})
	for _, want := range []string{
		"image policy: namespace locked, repository mirror.test/app",
		"  noMatchPolicy of namespace locked (an image no provider applies to): Deny\n",
		"  sigstore-image-policy: applies=false, repository mirror.test/app matches none of its matchImages (registry.test); a change of /etc/cri-image-proxy/sigstore-policy.yaml drops its cached verdicts (taken from its args)\n",
		`  verdict: refused: no provider applies, and namespace "locked"'s noMatchPolicy is Deny`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
