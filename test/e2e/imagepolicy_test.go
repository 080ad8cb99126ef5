package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/signtest"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// The keyless identity the tests sign as, and its issuer.
const (
	ciIdentity = "release@ci.rig.test"
	ciIssuer   = "https://issuer.ci.rig.test"
)

// buildSigstorePlugin builds cmd/sigstore-image-policy once for the tests
// that run it.
var buildSigstorePlugin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "e2e-policy-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "sigstore-image-policy")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/sigstore-image-policy").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building sigstore-image-policy: %v\n%s", err, out)
	}
	return bin, nil
})

// faultPlugins are image policy plugins that give no verdict, each as a
// shell script: the faults a provider's failurePolicy is about.
var faultPlugins = map[string]string{
	"crash":         "cat >/dev/null\nkill -SEGV $$\n",
	"hang":          "cat >/dev/null\nsleep 600\n",
	"garbage":       "cat >/dev/null\necho 'this is not json'\n",
	"other-version": "cat >/dev/null\necho '{\"apiVersion\":\"imagepolicy.cri-image-proxy.io/v9\",\"kind\":\"ImagePolicyResponse\",\"allowed\":true}'\n",
	"crash-ignored": "cat >/dev/null\nkill -SEGV $$\n",
}

// policySetup is what the image policy tests sign with and verify against:
// a key the test generated, sigstore-go's test signing authority, the
// reference plugin and the fault plugins in one bin directory, the
// plugin's policy (its namespaces require a signature by the key or the CI
// identity), and the proxy's ImagePolicyConfig.
type policySetup struct {
	dir, binDir, config string
	key, otherKey       *signtest.Key
	authority           *signtest.Authority
}

// policyOptions say which namespaces require a signature.
type policyOptions struct {
	// namespaces require a signature, for images of the rig's registries.
	namespaces []string
	// defaultNamespace is that of pulls without a pod; "": none.
	defaultNamespace string
	// faults adds a provider of each of faultPlugins, for namespace
	// fault-NAME (Ignore for crash-ignored, else Fail), 2s timeout.
	faults bool
}

func newPolicySetup(t *testing.T, o policyOptions) *policySetup {
	t.Helper()
	plugin, err := buildSigstorePlugin()
	if err != nil {
		t.Fatal(err)
	}
	ps := &policySetup{dir: filepath.Join(testRig.Dir, "image-policy-"+strings.ReplaceAll(t.Name(), "/", "-"))}
	ps.binDir = filepath.Join(ps.dir, "bin")
	if err := os.MkdirAll(ps.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(plugin)
	if err != nil {
		t.Fatal(err)
	}
	ps.write(t, "bin/sigstore-image-policy", string(data), 0o755)
	for name, script := range faultPlugins {
		ps.write(t, "bin/"+name, "#!/bin/sh\n"+script, 0o755)
	}
	if ps.key, err = signtest.NewKey(); err != nil {
		t.Fatal(err)
	}
	if ps.otherKey, err = signtest.NewKey(); err != nil {
		t.Fatal(err)
	}
	if ps.authority, err = signtest.NewAuthority(); err != nil {
		t.Fatal(err)
	}
	root, err := ps.authority.TrustedRootJSON()
	if err != nil {
		t.Fatal(err)
	}
	namespaces := "[" + strings.Join(o.namespaces, ", ") + "]"
	// The test authority issues certificates without SCTs. Paths are
	// quoted: a test's name (a node test's kubelet variant, say) may hold a
	// comma, which ends a YAML flow value.
	policy := ps.write(t, "sigstore-policy.yaml", `apiVersion: config.cri-image-proxy.io/v1alpha1
kind: SigstoreImagePolicy
trustedRoot: `+strconv.Quote(ps.write(t, "trusted_root.json", string(root), 0o644))+`
policies:
  - name: signed
    namespaces: `+namespaces+`
    authorities:
      - name: release-key
        key: {path: `+strconv.Quote(ps.write(t, "release.pub", string(ps.key.PublicKeyPEM()), 0o644))+`}
      - name: ci
        keyless:
          identities: [{issuer: "`+ciIssuer+`", subject: "`+ciIdentity+`"}]
          certificateTransparency: Ignore
`, 0o644)
	registries := fmt.Sprintf("[%q, %q]", testRig.AnonRegistry, testRig.Registry)
	var b strings.Builder
	b.WriteString("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\n")
	if o.defaultNamespace != "" {
		fmt.Fprintf(&b, "defaultNamespace: %s\n", o.defaultNamespace)
	}
	fmt.Fprintf(&b, `providers:
  - name: sigstore-image-policy
    apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1
    matchImages: %s
    namespaces: %s
    sendCredentials: true
    args: ["--policy", %q]
`, registries, namespaces, policy)
	for _, name := range []string{"crash", "hang", "garbage", "other-version", "crash-ignored"} {
		if !o.faults {
			break
		}
		failure := "Fail"
		if name == "crash-ignored" {
			failure = "Ignore"
		}
		fmt.Fprintf(&b, "  - {name: %s, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: %s, namespaces: [fault-%s], timeout: 2s, failurePolicy: %s}\n",
			name, registries, name, failure)
	}
	ps.config = ps.write(t, "image-policy.yaml", b.String(), 0o644)
	return ps
}

func (ps *policySetup) write(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(ps.dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// flags are the proxy's image policy flags.
func (ps *policySetup) flags() []string {
	return []string{"--image-policy-config", ps.config, "--image-policy-bin-dir", ps.binDir}
}

// pushUser pushes as the registry's "user" (every repository).
var pushUser = signtest.Options{Auth: &authn.Basic{Username: "user", Password: rig.Users["user"]}}

// push pushes a busybox image with marker to the rig's registry as repo
// (repository:tag) and returns "registry/repository@digest".
func push(t *testing.T, repo, marker string) string {
	t.Helper()
	d, err := testRig.PushBusybox(repo, marker)
	if err != nil {
		t.Fatal(err)
	}
	name, _, _ := strings.Cut(repo, ":")
	return testRig.Registry + "/" + name + "@" + d
}

// signWithKey signs a pushed image with key, cosign's tag convention.
func signWithKey(t *testing.T, digested string, key *signtest.Key) {
	t.Helper()
	if err := signtest.SignWithKey(context.Background(), digested, key, pushUser); err != nil {
		t.Fatal(err)
	}
}

// signKeyless signs a pushed image as the CI identity, a sigstore bundle
// attached as an OCI referrer (cosign v3; through the referrers tag on
// this registry, which has no referrers API).
func (ps *policySetup) signKeyless(t *testing.T, digested string) {
	t.Helper()
	o := pushUser
	o.Format = signtest.Referrer
	if err := signtest.SignKeyless(context.Background(), digested, ps.authority, ciIdentity, ciIssuer, o); err != nil {
		t.Fatal(err)
	}
}

// policyPod is a pod of namespace, as crictl describes it.
type policyPod struct{ name, config string }

func newPolicyPod(t *testing.T, namespace, name string) policyPod {
	return policyPod{name: name, config: podConfigIn(t, namespace, name, name+"-uid", true)}
}

// pull is a crictl pull with the pod's sandbox config.
func (p policyPod) pull(t *testing.T, ep, image string, extra ...string) rig.Result {
	t.Helper()
	return crictl(t, ep, append(append([]string{"pull", "--pod-config", p.config}, extra...), image)...)
}

// run starts the pod's sandbox and a container of image through ep (see
// container).
func (p policyPod) run(t *testing.T, ep, image, marker string, volumes ...string) error {
	t.Helper()
	return p.container(t, ep, p.sandbox(t, ep), image, marker, volumes...)
}

// container creates and starts a container of image in sandbox, mounting
// the first of volumes as an image volume if any, and waits until it
// printed marker ("": no wait); it returns the error of the step that
// failed, "create: ..." or "start: ...", with crictl's message.
func (p policyPod) container(t *testing.T, ep, sandbox, image, marker string, volumes ...string) error {
	t.Helper()
	containers++
	name := fmt.Sprintf("%s-%d", p.name, containers)
	cfg := containerConfig(t, name, image, "cat /marker; sleep 3600")
	if len(volumes) > 0 {
		cfg = mountConfig(t, name, image, volumes[0], volumes[0])
	}
	r := crictl(t, ep, "create", sandbox, cfg, p.config)
	if r.Err != nil {
		return fmt.Errorf("create: %s", crictlMessage(r.Stderr))
	}
	ctr := strings.TrimSpace(r.Stdout)
	t.Cleanup(func() { crictl(t, direct(), "rm", "-f", ctr) })
	if r := crictl(t, ep, "start", ctr); r.Err != nil {
		return fmt.Errorf("start: %s", crictlMessage(r.Stderr))
	}
	if marker == "" {
		return nil
	}
	waitUntil(t, 30*time.Second, func() error {
		if out := crictl(t, ep, "logs", ctr); !strings.Contains(out.Stdout, marker) {
			return fmt.Errorf("logs %q", out.Stdout)
		}
		return nil
	})
	return nil
}

// containers numbers the tests' containers, for unique names.
var containers int

// sandbox starts the pod's sandbox through ep; it is removed when the test
// ends.
func (p policyPod) sandbox(t *testing.T, ep string) string {
	t.Helper()
	id := strings.TrimSpace(mustCrictl(t, ep, "runp", p.config))
	t.Cleanup(func() { crictl(t, direct(), "stopp", id); crictl(t, direct(), "rmp", id) })
	return id
}

// refusedByPolicy fails the test unless r is a PermissionDenied whose
// message carries the policy's reason for the pod.
func refusedByPolicy(t *testing.T, what string, r rig.Result, reason string) {
	t.Helper()
	msg := crictlMessage(r.Stderr)
	if r.Err == nil || !strings.Contains(msg, "PermissionDenied") || !strings.Contains(msg, reason) {
		t.Errorf("%s: want PermissionDenied with %q, got %v: %s", what, reason, r.Err, msg)
	}
	t.Logf("%s refused: %s", what, msg)
}

// TestImagePolicy: namespace secure requires a cosign signature by
// the test's key or its keyless CI identity (sigstore-go's test signing
// authority), checked by the reference plugin on the node, on a proxy
// with ensure on and on one with ensure off. Signed images run; unsigned
// ones are refused at pull (before the runtime pulls) and at create,
// an unsigned image already on the node named by ID and an unsigned image
// volume included; a tag moved to an unsigned digest after a signed pull
// refuses the next pull; a pull without a pod is decided for the default
// namespace; other namespaces are unaffected; plugins that crash, hang,
// print garbage or another version are refused under Fail, and the daemon
// keeps serving.
func TestImagePolicy(t *testing.T) {
	needRig(t)
	ps := newPolicySetup(t, policyOptions{namespaces: []string{"secure", "node-pulls"}, defaultNamespace: "node-pulls", faults: true})
	anon := func(digested string) string {
		return testRig.AnonRegistry + strings.TrimPrefix(digested, testRig.Registry)
	}
	tagOf := func(digested, tag string) string { name, _, _ := strings.Cut(digested, "@"); return name + ":" + tag }

	// Public images (the registry's anonymous view of the same storage),
	// signed in both of cosign's layouts, not signed, and signed by a key
	// no policy trusts; a private image signed with the key, whose
	// signatures only the pull's credential can read.
	keySigned := push(t, "policy/key-signed:v1", "key-signed")
	signWithKey(t, keySigned, ps.key)
	keylessSigned := push(t, "policy/keyless-signed:v1", "keyless-signed")
	ps.signKeyless(t, keylessSigned)
	unsigned := push(t, "policy/unsigned:v1", "unsigned")
	otherKeySigned := push(t, "policy/other-key:v1", "other-key")
	signWithKey(t, otherKeySigned, ps.otherKey)
	private := push(t, "policy-private/app:v1", "private-signed")
	signWithKey(t, private, ps.key)
	images := map[string]string{ // by tag, as pods name them
		"key-signed": anon(tagOf(keySigned, "v1")), "keyless-signed": anon(tagOf(keylessSigned, "v1")),
		"unsigned": anon(tagOf(unsigned, "v1")), "other-key": anon(tagOf(otherKeySigned, "v1")), "private": tagOf(private, "v1"),
	}
	rmi := func() {
		for _, img := range images {
			crictl(t, direct(), "rmi", img)
		}
	}
	t.Cleanup(rmi)

	for _, mode := range policyModes(ps.dir) {
		t.Run(mode.name, func(t *testing.T) {
			rmi()
			slug := strings.ReplaceAll(mode.name, " ", "-")
			ep, proc := startProxy(t, "policy-"+slug, append(mode.flags, ps.flags()...)...)
			pod := func(ns, name string) policyPod { return newPolicyPod(t, ns, "pol-"+name+"-"+slug) }

			t.Run("an image signed with the key (cosign's tag convention) is pulled and runs in secure", func(t *testing.T) {
				p := pod("secure", "key")
				if r := p.pull(t, ep, images["key-signed"]); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.run(t, ep, images["key-signed"], "key-signed"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("an image signed keyless (a sigstore bundle as an OCI referrer) is pulled and runs in secure", func(t *testing.T) {
				p := pod("secure", "keyless")
				if r := p.pull(t, ep, images["keyless-signed"]); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.run(t, ep, images["keyless-signed"], "keyless-signed"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("a private image's signatures are read with the pull's credential", func(t *testing.T) {
				p := pod("secure", "private")
				if r := p.pull(t, ep, images["private"], "--creds", "alice:"+rig.Users["alice"]); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.run(t, ep, images["private"], "private-signed"); err != nil {
					t.Fatal(err)
				}
				if strings.Contains(proc.LogText(), rig.Users["alice"]) {
					t.Errorf("the proxy's log has the credential")
				}
			})
			t.Run("an unsigned image refused at pull leaves nothing on the node, by tag and by digest", func(t *testing.T) {
				p := pod("secure", "unsigned")
				// The policy decides on the digest the registry names before
				// the runtime is asked, ensure on or off.
				byDigest := anon(unsigned)
				for _, ref := range []string{images["unsigned"], byDigest} {
					refusedByPolicy(t, "unsigned", p.pull(t, ep, ref), "image is not signed")
					if r := crictl(t, direct(), "inspecti", ref); r.Err == nil {
						t.Errorf("the runtime holds %s after its pull was refused", ref)
					}
				}
				refusedByPolicy(t, "signed by an untrusted key", p.pull(t, ep, images["other-key"]), "no valid signature")
				if r := crictl(t, direct(), "inspecti", images["other-key"]); r.Err == nil {
					t.Errorf("the runtime holds %s after its pull was refused", images["other-key"])
				}
			})
			t.Run("other namespaces are unaffected: an unsigned image is pulled and runs", func(t *testing.T) {
				p := pod("other", "unsigned")
				if r := p.pull(t, ep, images["unsigned"]); r.Err != nil {
					t.Fatalf("pull: %v\n%s", r.Err, r.Stderr)
				}
				if err := p.run(t, ep, images["unsigned"], "unsigned"); err != nil {
					t.Fatal(err)
				}
			})
			t.Run("an unsigned image already on the node is refused at create, by tag and by ID", func(t *testing.T) {
				id := imageID(t, images["unsigned"])
				p := pod("secure", "present")
				sandbox := p.sandbox(t, ep)
				for _, ref := range []string{images["unsigned"], id, strings.TrimPrefix(id, "sha256:")[:12]} {
					err := p.container(t, ep, sandbox, ref, "")
					if err == nil || !strings.Contains(err.Error(), "create:") || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "image is not signed") {
						t.Errorf("a container of %s: %v, want refused at create by the policy", ref, err)
					}
				}
			})
			t.Run("an unsigned image volume is refused, a signed one mounts", func(t *testing.T) {
				if testRig.Runtime.Legacy() {
					t.Skipf("n/a: %s has no image volumes (containerd 2.1+)", testRig.Runtime.Name)
				}
				p := pod("secure", "volume")
				err := p.run(t, ep, images["key-signed"], "", images["unsigned"])
				if err == nil || !strings.Contains(err.Error(), "create:") || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "image is not signed") {
					t.Errorf("unsigned volume: %v, want refused at create by the policy", err)
				}
				t.Logf("refused: %v", err)
				if err := pod("secure", "volume-signed").run(t, ep, images["key-signed"], "", images["keyless-signed"]); err != nil {
					t.Errorf("signed volume: %v", err)
				}
			})
			t.Run("a tag moved to an unsigned digest after a signed pull refuses the next pod's pull, and the node's tag stays on the signed image", func(t *testing.T) {
				moving := "policy/moving:" + slug
				signWithKey(t, push(t, moving, "moving-signed"), ps.key)
				img := testRig.AnonRegistry + "/" + moving
				t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
				if r := pod("secure", "moving-1").pull(t, ep, img); r.Err != nil {
					t.Fatalf("the signed pull: %v\n%s", r.Err, r.Stderr)
				}
				signedID := imageID(t, img)
				unsignedRef := push(t, moving, "moving-unsigned")
				refusedByPolicy(t, "the next pod", pod("secure", "moving-2").pull(t, ep, img), "image is not signed")
				if got := imageID(t, img); got != signedID {
					t.Errorf("the node's tag moved to %s, want it on the signed image %s", got, signedID)
				}
				if r := crictl(t, direct(), "inspecti", anon(unsignedRef)); r.Err == nil {
					t.Errorf("the runtime holds the unsigned image its refused pull named")
				}
				// A pod of the signed image by that tag runs it, as before.
				if err := pod("secure", "moving-3").run(t, ep, img, "moving-signed"); err != nil {
					t.Errorf("a pod of the signed image by its tag: %v", err)
				}
			})
			t.Run("a pull without a pod is decided for the default namespace", func(t *testing.T) {
				r := crictl(t, ep, "pull", images["other-key"])
				refusedByPolicy(t, "no pod", r, "no valid signature")
				if r := crictl(t, ep, "pull", images["keyless-signed"]); r.Err != nil {
					t.Errorf("a signed image without a pod: %v\n%s", r.Err, r.Stderr)
				}
			})
			t.Run("records explain --namespace says what the policy decides and has cached", func(t *testing.T) {
				if !slices.Contains(mode.flags, "--ensure-secret-pulled-images") {
					t.Skip("n/a: the admin socket is ensure's")
				}
				out, err := exec.Command(proxyBin, "records", "explain", images["key-signed"], "--namespace", "secure",
					"--admin-socket", filepath.Join(ps.dir, "admin.sock"), "--runtime-endpoint", direct()).CombinedOutput()
				if err != nil || !strings.Contains(string(out), "sigstore-image-policy: applies=true") || !strings.Contains(string(out), "allowed: cached by every provider") {
					t.Errorf("records explain: %v\n%s", err, out)
				}
				t.Logf("records explain:\n%s", out)
			})
			t.Run("plugin faults are refused under Fail, allowed under Ignore, and the daemon keeps serving", func(t *testing.T) {
				for _, fault := range []string{"crash", "hang", "garbage", "other-version"} {
					r := pod("fault-"+fault, "fault-"+fault).pull(t, ep, images["key-signed"])
					refusedByPolicy(t, fault, r, "could not decide")
				}
				if r := pod("fault-crash-ignored", "fault-ignored").pull(t, ep, images["key-signed"]); r.Err != nil {
					t.Errorf("a crash under Ignore: %v\n%s", r.Err, r.Stderr)
				}
				if log := proc.LogText(); strings.Count(log, "image policy plugin gave no verdict") < 5 {
					t.Errorf("the log does not say why each plugin gave no verdict")
				}
				mustCrictl(t, ep, "version")
				if r := pod("secure", "after-faults").pull(t, ep, images["keyless-signed"]); r.Err != nil {
					t.Errorf("a signed pull after the faults: %v\n%s", r.Err, r.Stderr)
				}
			})
		})
	}
}

// allowAllPolicy writes an image policy whose one plugin, a shell script,
// allows every image of the rig's registry in namespace e2e (the tests'
// pods), and returns the proxy's flags for it: the image policy's metrics
// then have values.
func allowAllPolicy(t *testing.T, name string) []string {
	t.Helper()
	dir := filepath.Join(testRig.Dir, "allow-all-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WritePlugin(t, dir, "allow-all", "cat >/dev/null\necho '{\"apiVersion\":\"imagepolicy.cri-image-proxy.io/v1alpha1\",\"kind\":\"ImagePolicyResponse\",\"allowed\":true,\"reason\":\"allow-all\"}'\n")
	config := filepath.Join(dir, "image-policy.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`apiVersion: config.cri-image-proxy.io/v1alpha1
kind: ImagePolicyConfig
providers:
  - {name: allow-all, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [%q], namespaces: [e2e]}
`, testRig.Registry)), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--image-policy-config", config, "--image-policy-bin-dir", dir}
}

// A policyMode is one of the two ways image policy runs in the proxy:
// asked by ensure's guard (ensure on), or on its own hooks (ensure off).
type policyMode struct {
	name  string
	flags []string // the proxy's, beside the policy's own
}

// policyModes are both modes, ensure's files in dir.
func policyModes(dir string) []policyMode {
	return []policyMode{
		{"ensure on", []string{"--ensure-secret-pulled-images", "--ensure-database", filepath.Join(dir, "ensure.db"), "--admin-socket", filepath.Join(dir, "admin.sock")}},
		{"ensure off", nil},
	}
}
