package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// runBake runs cri-image-proxy bake against the rig's containerd.
func runBake(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), proxyBin, append([]string{"bake", "--runtime-endpoint", direct(), "--no-progress"}, args...)...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

func TestBake(t *testing.T) {
	needRig(t)
	push := func(ref string) string {
		t.Helper()
		if _, err := testRig.PushBusybox(ref, "bake "+ref); err != nil {
			t.Fatal(err)
		}
		img := testRig.Registry + "/" + ref
		t.Cleanup(func() { crictl(t, direct(), "rmi", img) })
		return img
	}
	appA, appB, appC := push("bake/app-a:v1"), push("bake/app-b:v1"), push("bake/app-c:v1")
	missing := testRig.Registry + "/bake/missing:v1"
	dir := t.TempDir()
	list := filepath.Join(dir, "images.txt")
	os.WriteFile(list, []byte(fmt.Sprintf("# the node image's images\n%s\n%s   # b\n\n%s\n%s\n", appA, missing, appB, appA)), 0o644)
	plugins := newPluginSetup(t, map[string]string{"bake-creds": "alice:" + rig.Users["alice"]})
	db := filepath.Join(dir, "ensure.db")
	allow := filepath.Join(dir, "allowlist.yaml")
	pluginArgs := []string{"--image-credential-provider-config", plugins.config, "--image-credential-provider-bin-dir", plugins.binDir}
	secrets := []string{rig.Users["alice"], rig.Users["bob"], rig.Users["user"]}
	noSecret := func(t *testing.T, texts ...string) {
		t.Helper()
		for _, text := range texts {
			for _, s := range secrets {
				if strings.Contains(text, s) {
					t.Errorf("a password is printed")
				}
			}
		}
	}
	digestOf := func(t *testing.T, img string) string {
		t.Helper()
		out := mustCrictl(t, direct(), "inspecti", "-o", "go-template", "--template", "{{range .status.repoDigests}}{{.}} {{end}}", img)
		for _, d := range strings.Fields(out) {
			if _, dg, ok := strings.Cut(d, "@"); ok {
				return dg
			}
		}
		t.Fatalf("no repo digest for %s: %q", img, out)
		return ""
	}

	var first string
	t.Run("the plugins' credentials pull every image but the missing one, which fails the run by name", func(t *testing.T) {
		stdout, stderr, err := runBake(t, append(pluginArgs, "--images", list, "--record-preloaded", "--ensure-database", db, "--allowlist-out", allow)...)
		first = stdout
		if err == nil {
			t.Fatalf("bake succeeded with a missing image:\n%s", stdout)
		}
		if !strings.Contains(stderr, "1 of 3 image(s) failed") || !strings.Contains(stderr, missing) {
			t.Errorf("the error does not name the missing image:\n%s", stderr)
		}
		for _, img := range []string{appA, appB} {
			line := lineWith(stdout, img)
			if !strings.Contains(line, digestOf(t, img)) || !strings.Contains(line, "bake-creds") || !strings.HasSuffix(line, "ok") {
				t.Errorf("summary line for %s: %q", img, line)
			}
		}
		if line := lineWith(stdout, missing); !strings.HasSuffix(line, "FAILED") {
			t.Errorf("summary line for the missing image: %q", line)
		}
		if !strings.Contains(stdout, "recorded 2 image(s) as preloaded") {
			t.Errorf("no record summary:\n%s", stdout)
		}
		noSecret(t, stdout, stderr)
		t.Logf("bake's summary:\n%s", stdout)
	})

	t.Run("a second run pulls the same digests and records nothing new", func(t *testing.T) {
		good := filepath.Join(dir, "good.txt")
		os.WriteFile(good, []byte(appA+"\n"+appB+"\n"), 0o644)
		stdout, stderr, err := runBake(t, append(pluginArgs, "--images", good, "--record-preloaded", "--ensure-database", db)...)
		if err != nil {
			t.Fatalf("%v\n%s\n%s", err, stdout, stderr)
		}
		for _, img := range []string{appA, appB} {
			if d := digestOf(t, img); !strings.Contains(lineWith(stdout, img), d) || !strings.Contains(lineWith(first, img), d) {
				t.Errorf("%s: digest changed between runs", img)
			}
		}
		out, err := exec.Command(proxyBin, "records", "list", "--database", db, "--runtime-endpoint", direct()).CombinedOutput()
		if err != nil || strings.Count(string(out), "bake/app-") != 2 {
			t.Errorf("records after two runs (%v):\n%s", err, out)
		}
	})

	t.Run("a docker config.json serves as well, the list read from stdin", func(t *testing.T) {
		cfg := filepath.Join(dir, "config.json")
		os.WriteFile(cfg, []byte(fmt.Sprintf(`{"auths":{%q:{"username":"bob","password":%q}}}`, testRig.Registry, rig.Users["bob"])), 0o600)
		cmd := exec.Command(proxyBin, "bake", "--runtime-endpoint", direct(), "--no-progress", "--images", "-", "--docker-config", cfg)
		cmd.Stdin = strings.NewReader(appC + "\n")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || !strings.Contains(lineWith(string(out), appC), "docker-config") {
			t.Errorf("%v\n%s\n%s", err, out, stderr.String())
		}
		noSecret(t, string(out), stderr.String())
	})

	t.Run("an empty list is an error", func(t *testing.T) {
		_, stderr, err := runBake(t, "--images", "-")
		if err == nil || !strings.Contains(stderr, "lists no image") {
			t.Errorf("%v: %s", err, stderr)
		}
	})

	t.Run("the ensure proxy hands the recorded images to every pod, under AlwaysVerify too", func(t *testing.T) {
		p := startEnsureProxy(t, "bake-always", "--ensure-database", db, "--image-pull-credentials-verification-policy", "AlwaysVerify")
		for _, img := range []string{appA, appB} {
			if r := crictl(t, p.ep, "inspecti", img); r.Err != nil {
				t.Errorf("%s hidden from a pod without credentials: %s", img, r.Stderr)
			}
		}
		// Control: appC was baked without a record; AlwaysVerify hides it.
		if r := crictl(t, p.ep, "inspecti", appC); r.Err == nil {
			t.Errorf("%s shown under AlwaysVerify without a record", appC)
		}
	})

	t.Run("the allowlist fragment lets NeverVerifyAllowlistedImages hand out exactly the baked repositories", func(t *testing.T) {
		data, err := os.ReadFile(allow)
		if err != nil {
			t.Fatal(err)
		}
		var frag struct {
			Ensure map[string]any `json:"ensureSecretPulledImages"`
		}
		if err := yaml.UnmarshalStrict(data, &frag); err != nil {
			t.Fatal(err)
		}
		repos := []string{strings.TrimSuffix(appA, ":v1"), strings.TrimSuffix(appB, ":v1")}
		got := fmt.Sprint(frag.Ensure["preloadedImagesVerificationAllowlist"])
		if got != fmt.Sprint(repos) || frag.Ensure["imagePullCredentialsVerificationPolicy"] != "NeverVerifyAllowlistedImages" {
			t.Fatalf("fragment:\n%s", data)
		}
		// The fragment merged into a configuration, on a fresh database: the
		// images are present and were never pulled by this proxy.
		frag.Ensure["enabled"] = true
		frag.Ensure["databasePath"] = filepath.Join(dir, "fresh", "ensure.db")
		frag.Ensure["adminSocket"] = filepath.Join(dir, "fresh", "admin.sock")
		cfg, _ := yaml.Marshal(map[string]any{"apiVersion": "config.cri-image-proxy.io/v1alpha1", "kind": "ProxyConfiguration", "ensureSecretPulledImages": frag.Ensure})
		cfgPath := filepath.Join(dir, "config.yaml")
		os.WriteFile(cfgPath, cfg, 0o644)
		ep, _ := startProxy(t, "bake-allow", "--config", cfgPath)
		for img, shown := range map[string]bool{appA: true, appB: true, appC: false} {
			if r := crictl(t, ep, "inspecti", img); (r.Err == nil) != shown {
				t.Errorf("%s: shown %v, want %v", img, r.Err == nil, shown)
			}
		}
	})
}

// lineWith returns the first line of text that contains s.
func lineWith(text, s string) string {
	lines := strings.Split(text, "\n")
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, s) }); i >= 0 {
		return strings.TrimSpace(lines[i])
	}
	return ""
}
