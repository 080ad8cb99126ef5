package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// TestConfigReload changes a running proxy's configuration: its credential
// provider configuration (rewritten in place, as a configuration tool
// does), its policy (in the configuration file), then what only a restart
// can change, and a broken provider file. The proxy applies what it can
// without a restart, keeps the configuration in use when the new one is
// refused, and says so in its metrics.
func TestConfigReload(t *testing.T) {
	needRig(t)
	s := newPluginDir(t, "reload")
	dockerConfig := filepath.Join(s.dir, "config.json")
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": "user", "password": rig.Users["user"]}}})
	os.WriteFile(dockerConfig, b, 0o600)
	s.wrap(t, "node-creds", pluginBin)
	providers := func(repos ...string) string {
		var m []string
		for _, r := range repos {
			m = append(m, fmt.Sprintf("%q", testRig.Registry+"/"+r))
		}
		return fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: node-creds\n    matchImages: [%s]\n    defaultCacheDuration: 10m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n    args: [\"--docker-config\", %q]\n", strings.Join(m, ", "), dockerConfig)
	}
	// Written beside and renamed over, as configuration tools do.
	replace := func(path, content string) {
		t.Helper()
		if err := os.WriteFile(path+".new", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	replace(s.config, providers("team-b"))
	db := filepath.Join(s.dir, "ensure.db")
	proxyConfig := func(policy, shutdown string) string {
		return fmt.Sprintf("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\nshutdownTimeout: %s\ncredentialProviders:\n  config: %s\n  binDir: %s\nensureSecretPulledImages:\n  enabled: true\n  databasePath: %s\n  adminSocket: %s\n  imagePullCredentialsVerificationPolicy: %s\n",
			shutdown, s.config, s.binDir, db, filepath.Join(s.dir, "admin.sock"), policy)
	}
	cfgPath := filepath.Join(s.dir, "proxy.yaml")
	replace(cfgPath, proxyConfig("NeverVerifyPreloadedImages", "30s"))

	mon := freeAddr(t)
	ep, p := startProxy(t, "reload", "--config", cfgPath, "--monitoring-address", mon)
	reloads := func(result string) string {
		_, m := httpGet(t, mon, "/metrics")
		if v := regexp.MustCompile(`cri_image_proxy_config_reloads_total\{result="` + result + `"\} (\d+)`).FindStringSubmatch(m); v != nil {
			return v[1]
		}
		return "0"
	}
	configHash := func() string {
		_, m := httpGet(t, mon, "/metrics")
		return regexp.MustCompile(`cri_image_proxy_config_info\{hash="([^"]+)"\} 1`).FindStringSubmatch(m)[1]
	}
	waitReloads := func(result, n string) {
		t.Helper()
		waitUntil(t, 30*time.Second, func() error {
			if got := reloads(result); got != n {
				return fmt.Errorf("%s reloads: %s, want %s", result, got, n)
			}
			return nil
		})
	}
	teamA := testRig.Registry + "/" + rig.TeamAImage

	t.Run("a provider added to the provider file injects from the next pull, with no restart", func(t *testing.T) {
		if r := crictl(t, ep, "pull", teamA); r.Err == nil {
			t.Fatalf("team-a pulled without credentials before its provider was configured")
		}
		before := configHash()
		replace(s.config, providers("team-b", "team-a"))
		waitReloads("applied", "1")
		if r := crictl(t, ep, "pull", teamA); r.Err != nil {
			t.Fatalf("pull after the reload: %v\n%s", r.Err, r.Stderr)
		}
		if configHash() == before {
			t.Errorf("cri_image_proxy_config_info kept its hash %s", before)
		}
		if !strings.Contains(p.LogText(), "configuration reloaded") {
			t.Errorf("no log line for the reload")
		}
	})

	t.Run("a broken provider file is refused and the configuration in use keeps serving", func(t *testing.T) {
		replace(s.config, "providers: [this is not: a config\n")
		waitReloads("refused", "1")
		if r := crictl(t, ep, "pull", teamA); r.Err != nil {
			t.Fatalf("pull with the kept configuration: %v\n%s", r.Err, r.Stderr)
		}
		if !strings.Contains(p.LogText(), "configuration reload refused") {
			t.Errorf("no log line for the refusal")
		}
		replace(s.config, providers("team-b", "team-a"))
		waitReloads("applied", "2")
	})

	t.Run("the policy changed in the configuration file decides the next ImageStatus; SIGHUP reloads too", func(t *testing.T) {
		busybox := testRig.Registry + "/" + rig.BusyboxImage
		mustCrictl(t, direct(), "pull", "--creds", "user:"+rig.Users["user"], busybox) // preloaded: pulled outside the proxy
		if r := crictl(t, ep, "inspecti", busybox); r.Err != nil {
			t.Fatalf("a preloaded image hidden under NeverVerifyPreloadedImages: %v", r.Err)
		}
		replace(cfgPath, proxyConfig("AlwaysVerify", "30s"))
		waitReloads("applied", "3")
		if r := crictl(t, ep, "inspecti", busybox); r.Err == nil {
			t.Errorf("a preloaded image shown under AlwaysVerify")
		}
		// The same file again, by signal: applied, nothing changes.
		if err := p.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitReloads("applied", "4")
	})

	t.Run("a change only a restart applies is refused, by name", func(t *testing.T) {
		replace(cfgPath, proxyConfig("AlwaysVerify", "45s"))
		waitReloads("refused", "2")
		if !strings.Contains(p.LogText(), "shutdownTimeout changed: only a restart applies that") {
			t.Errorf("the refusal does not name the field:\n%s", tail(p.LogText(), 5))
		}
	})
}
