package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

func TestRestartOnly(t *testing.T) {
	base := func() *config.ProxyConfiguration {
		c := config.Default()
		c.CredentialProviders = &config.CredentialProviders{Config: "/etc/providers.yaml", BinDir: "/usr/libexec/plugins"}
		c.EnsureSecretPulledImages.Enabled = true
		c.ImagePolicy = &config.ImagePolicy{Config: "/etc/image-policy.d", BinDir: "/usr/libexec/policy"}
		c.SetDefaults()
		return c
	}
	for _, tc := range []struct {
		name   string
		change func(*config.ProxyConfiguration)
		want   string
	}{
		{"nothing changed: nothing to restart for", func(*config.ProxyConfiguration) {}, ""},
		{"the policy and its allowlist are applied by a reload", func(c *config.ProxyConfiguration) {
			c.EnsureSecretPulledImages.ImagePullCredentialsVerificationPolicy = "NeverVerifyAllowlistedImages"
			c.EnsureSecretPulledImages.PreloadedImagesVerificationAllowlist = []string{"registry.example/base/*"}
		}, ""},
		{"the provider configuration and plugins' directory are applied by a reload", func(c *config.ProxyConfiguration) {
			c.CredentialProviders.Config, c.CredentialProviders.BinDir = "/etc/other.yaml", "/opt/plugins"
		}, ""},
		{"the image policy configuration and plugins' directory are applied by a reload", func(c *config.ProxyConfiguration) {
			c.ImagePolicy.Config, c.ImagePolicy.BinDir = "/etc/other-policy.yaml", "/opt/policy"
		}, ""},
		{"turning the image policy off needs a restart", func(c *config.ProxyConfiguration) { c.ImagePolicy = nil }, "imagePolicy"},
		{"the socket needs a restart", func(c *config.ProxyConfiguration) { c.Socket.Path = "/run/other.sock" }, "socket"},
		{"the shutdown timeout needs a restart", func(c *config.ProxyConfiguration) { c.ShutdownTimeout.Duration = time.Minute }, "shutdownTimeout"},
		{"the plugins' cache size needs a restart", func(c *config.ProxyConfiguration) { c.CredentialProviders.CacheSize = 7 }, "credentialProviders"},
		{"turning injection off needs a restart", func(c *config.ProxyConfiguration) { c.CredentialProviders = nil }, "credentialProviders"},
		{"turning ensure off needs a restart", func(c *config.ProxyConfiguration) { c.EnsureSecretPulledImages.Enabled = false }, "ensureSecretPulledImages"},
		{"the vouched mirrors are applied by a reload", func(c *config.ProxyConfiguration) {
			c.RegistryCheck.VouchedMirrors = []config.VouchedMirror{{Registry: "docker.io", Endpoint: "https://mirror.example"}}
		}, ""},
		{"the registry hosts directory needs a restart", func(c *config.ProxyConfiguration) { c.RegistryCheck.HostsDir = "/etc/other/certs.d" }, "registryCheck"},
		{"the registries.conf path needs a restart", func(c *config.ProxyConfiguration) {
			c.RegistryCheck.RegistriesConf = "/etc/containers/registries.conf"
		}, "registryCheck"},
		{"the registry check's bounds need a restart", func(c *config.ProxyConfiguration) { c.RegistryCheck.ProofTimeout.Duration = time.Hour }, "registryCheck"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base()
			tc.change(next)
			if got := strings.Join(restartOnly(base(), next), ","); got != tc.want {
				t.Errorf("restartOnly = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestMovingTheRegistrySettingsOutOfTheDeprecatedPlaceIsAReload: a file
// that moves its registry hosts directory and mirrors from
// ensureSecretPulledImages to registryCheck, unchanged, changes nothing a
// restart would be needed for.
func TestMovingTheRegistrySettingsOutOfTheDeprecatedPlaceIsAReload(t *testing.T) {
	t.Parallel()
	mirrors := []config.VouchedMirror{{Registry: "docker.io", Endpoint: "https://mirror.example"}}
	old := config.Default()
	old.RegistryCheck = config.RegistryCheck{}
	old.EnsureSecretPulledImages.RegistryHostsDir = "/etc/node/certs.d"
	old.EnsureSecretPulledImages.VouchedMirrors = mirrors
	old.SetDefaults()
	next := config.Default()
	next.RegistryCheck.HostsDir = "/etc/node/certs.d"
	next.RegistryCheck.VouchedMirrors = mirrors
	for _, c := range []*config.ProxyConfiguration{old, next} {
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if fields := restartOnly(old, next); len(fields) > 0 {
		t.Errorf("restartOnly = %v, want nothing", fields)
	}
	if got := newDeprecations(next, old); len(got) != 2 {
		t.Errorf("going back to the deprecated place warns of %v, want both fields", got)
	}
	if got := newDeprecations(old, old); len(got) != 0 {
		t.Errorf("a reload of the same file warns again of %v", got)
	}
}

func TestReloadRefusedKeepsTheCurrentConfiguration(t *testing.T) {
	cur := config.Default()
	cur.SetDefaults()
	reg := prometheus.NewRegistry()
	r, err := newReloader(func() (*config.ProxyConfiguration, error) { return nil, errors.New("config /etc/x.yaml: line 3: bad") },
		cur, reloadTargets{}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	hash := r.hash(cur)
	if err := r.Reload("test"); err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("got %v, want the load error", err)
	}
	if r.current != cur {
		t.Errorf("the current configuration changed on a refused reload")
	}
	if n := testutil.ToFloat64(r.reloads.WithLabelValues("refused")); n != 1 {
		t.Errorf("refused reloads %v, want 1", n)
	}
	if n := testutil.ToFloat64(r.info.WithLabelValues(hash)); n != 1 {
		t.Errorf("config_info lost the current hash %s", hash)
	}

	next := config.Default()
	next.ShutdownTimeout.Duration = time.Hour
	next.SetDefaults()
	r.load = func() (*config.ProxyConfiguration, error) { return next, nil }
	if err := r.Reload("test"); err == nil || !strings.Contains(err.Error(), "shutdownTimeout changed") {
		t.Fatalf("got %v, want shutdownTimeout named", err)
	}
}

func TestTheLastReloadsResultIsAGauge(t *testing.T) {
	t.Parallel()
	cur := config.Default()
	var loadErr error
	r, err := newReloader(func() (*config.ProxyConfiguration, error) { return cur, loadErr }, cur, reloadTargets{}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name   string
		reload bool
		err    error
		want   float64
	}{
		{"at the start no reload failed", false, nil, 1},
		{"a refused reload sets it to 0", true, errors.New("bad file"), 0},
		{"it stays 0 while reloads are refused", true, errors.New("still bad"), 0},
		{"a reload applied sets it back to 1", true, nil, 1},
	} {
		if step.reload {
			loadErr = step.err
			_ = r.Reload("test")
		}
		if got := testutil.ToFloat64(r.lastOK); got != step.want {
			t.Errorf("%s: config_last_reload_successful = %v, want %v", step.name, got, step.want)
		}
	}
}

// imagePolicyFiles makes a plugins directory with one plugin, "policy",
// and an image policy configuration file whose one provider applies to
// registry.test in the namespace write names.
func imagePolicyFiles(t *testing.T) (bin, file string, write func(namespace string)) {
	t.Helper()
	dir := t.TempDir()
	bin = filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WritePlugin(t, bin, "policy", "exit 1\n")
	file = filepath.Join(dir, "policy.yaml")
	write = func(namespace string) {
		t.Helper()
		data := "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n" +
			"  - {name: policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [registry.test], namespaces: [" + namespace + "]}\n"
		if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return bin, file, write
}

// TestReloadAppliesTheImagePolicy: a reload loads the image policy
// configuration anew and swaps it in (config_info's hash follows); a
// configuration that does not load is refused, and the engine keeps the
// one it has.
func TestReloadAppliesTheImagePolicy(t *testing.T) {
	t.Parallel()
	bin, file, write := imagePolicyFiles(t)
	write("secure")
	cur := config.Default()
	cur.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
	cur.SetDefaults()
	engine, err := newImagePolicy(cur.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := newReloader(func() (*config.ProxyConfiguration, error) { return cur, nil }, cur, reloadTargets{policy: engine}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	before := r.hash(cur)
	if !engine.Applies("secure", "registry.test/app") || engine.Applies("payments", "registry.test/app") {
		t.Fatal("the engine does not have the first configuration")
	}
	write("payments")
	if err := r.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if !engine.Applies("payments", "registry.test/app") || engine.Applies("secure", "registry.test/app") {
		t.Errorf("the reload did not apply the new image policy")
	}
	if r.hash(cur) == before {
		t.Errorf("config_info's hash did not follow the image policy's content")
	}
	if err := os.WriteFile(file, []byte("providers: [{name: nope}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload("test"); err == nil {
		t.Fatal("a configuration that does not load was applied")
	}
	if !engine.Applies("payments", "registry.test/app") {
		t.Errorf("a refused reload changed the engine's configuration")
	}
	if !r.relevant(file, "") || !r.relevant(filepath.Join(bin, "policy"), "") {
		t.Errorf("changes of the image policy's file or plugins are not watched")
	}
}

// TestAReloadWithAnInvalidVouchedMirrorListSwapsNothing: a list of vouched
// mirrors the registry check refuses (one registry named twice) refuses
// the reload before the image policy, loaded from the same reload, is
// swapped in.
func TestAReloadWithAnInvalidVouchedMirrorListSwapsNothing(t *testing.T) {
	t.Parallel()
	bin, file, write := imagePolicyFiles(t)
	write("secure")
	cur := config.Default()
	cur.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
	cur.EnsureSecretPulledImages.Enabled = true
	cur.SetDefaults()
	engine, err := newImagePolicy(cur.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	checker, err := registry.New(registry.Options{HostsDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	next := *cur
	next.RegistryCheck.VouchedMirrors = []config.VouchedMirror{
		{Registry: "docker.io", Endpoint: "https://mirror-a.example"}, {Registry: "index.docker.io", Endpoint: "https://mirror-b.example"},
	}
	r, err := newReloader(func() (*config.ProxyConfiguration, error) { return &next, nil }, cur, reloadTargets{registry: checker, policy: engine}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	write("payments")
	if err := r.Reload("test"); err == nil || !strings.Contains(err.Error(), "registryCheck.vouchedMirrors") {
		t.Fatalf("got %v, want the vouched mirrors refused", err)
	}
	if !engine.Applies("secure", "registry.test/app") || engine.Applies("payments", "registry.test/app") {
		t.Errorf("a refused reload swapped the image policy in")
	}
}

// TestAReloadWithABrokenRegistriesConfSwapsNothing: the node's
// registries.conf, read again at a reload, refuses it when it does not
// parse, naming the file, before the image policy is swapped in; the
// registry check keeps the file read before.
func TestAReloadWithABrokenRegistriesConfSwapsNothing(t *testing.T) {
	t.Parallel()
	bin, file, write := imagePolicyFiles(t)
	write("secure")
	regconf := filepath.Join(t.TempDir(), "registries.conf")
	if err := os.WriteFile(regconf, []byte("[[registry]]\nlocation = \"registry.test\"\nblocked = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cur := config.Default()
	cur.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
	cur.RegistryCheck.RegistriesConf = regconf
	cur.SetDefaults()
	engine, err := newImagePolicy(cur.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	checker, err := newRegistryCheck(cur.RegistryCheck, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	load := func() (*config.ProxyConfiguration, error) { next := *cur; return &next, nil }
	r, err := newReloader(load, cur, reloadTargets{registry: checker, policy: engine}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	write("payments")
	if err := os.WriteFile(regconf, []byte("[[registry]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload("test"); err == nil || !strings.Contains(err.Error(), "registryCheck.registriesConf") || !strings.Contains(err.Error(), regconf) {
		t.Fatalf("got %v, want the reload refused naming %s", err, regconf)
	}
	if !engine.Applies("secure", "registry.test/app") || engine.Applies("payments", "registry.test/app") {
		t.Errorf("a refused reload swapped the image policy in")
	}
	if _, err := checker.Check(context.Background(), registry.Request{Image: "registry.test/app:v1"}); !errors.Is(err, registry.ErrDenied) {
		t.Errorf("the registry check lost the file read before (registry.test blocked): got %v", err)
	}
}

// TestConfigInfoKeepsItsHashOnAReloadOfUnchangedFiles: the hash published
// at the start covers all that a reload's does (the image policy's content
// included), so a reload of files nobody changed leaves the label as it
// was, and a fleet does not see a node change configuration.
func TestConfigInfoKeepsItsHashOnAReloadOfUnchangedFiles(t *testing.T) {
	t.Parallel()
	bin, file, write := imagePolicyFiles(t)
	write("secure")
	cur := config.Default()
	cur.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
	cur.SetDefaults()
	engine, err := newImagePolicy(cur.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	load := func() (*config.ProxyConfiguration, error) { next := *cur; return &next, nil }
	r, err := newReloader(load, cur, reloadTargets{policy: engine}, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	atStart := configInfoHash(t, reg)
	if err := r.Reload("test"); err != nil {
		t.Fatal(err)
	}
	if got := configInfoHash(t, reg); got != atStart {
		t.Errorf("config_info's hash went from %s at the start to %s on a reload of unchanged files", atStart, got)
	}
}

// configInfoHash is the hash label of the one config_info series on reg.
func configInfoHash(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "cri_image_proxy_config_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 || len(mf.GetMetric()[0].GetLabel()) != 1 {
			t.Fatalf("config_info has %d series, want one with a hash label", len(mf.GetMetric()))
		}
		return mf.GetMetric()[0].GetLabel()[0].GetValue()
	}
	t.Fatal("no config_info on the registry")
	return ""
}

// TestAPluginsWatchedFileDropsItsVerdictsWithoutAReload: the reloader
// watches the directories of the image policy plugins' watchFiles; a
// change of the plugin's policy file drops the provider's cached verdicts
// with no SIGHUP, and no reload (which a configuration it refuses would
// not apply).
func TestAPluginsWatchedFileDropsItsVerdictsWithoutAReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.WritePlugin(t, bin, "policy", `cat >/dev/null
echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}'
`)
	plugin := filepath.Join(dir, "plugin")
	if err := os.MkdirAll(plugin, 0o755); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(plugin, "policy.yaml")
	if err := os.WriteFile(policy, []byte("keys: [release]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "image-policy.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n"+
		"  - {name: policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [registry.test], namespaces: [secure], args: [--policy, "+policy+"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cur := config.Default()
	cur.ImagePolicy = &config.ImagePolicy{Config: file, BinDir: bin}
	cur.SetDefaults()
	engine, err := newImagePolicy(cur.ImagePolicy, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var reloads atomic.Int32
	r, err := newReloader(func() (*config.ProxyConfiguration, error) { reloads.Add(1); return nil, errors.New("refused") }, cur,
		reloadTargets{policy: engine}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, "") }()
	defer func() { cancel(); <-done }()

	s := imagepolicy.Subject{Call: imagepolicy.CallPullImage, Image: "registry.test/app:v1", Repository: "registry.test/app",
		Digest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", Pod: imagepolicy.Pod{Namespace: "secure"}}
	cached := func() bool { return engine.Explain(s).Providers[0].Cached != nil }
	if v, err := engine.Decide(ctx, s); err != nil || !v.Allowed || !cached() {
		t.Fatalf("verdict %+v, %v: want an allow, cached", v, err)
	}
	if got := engine.Explain(s).Providers[0].WatchFiles; len(got) != 1 || got[0] != policy {
		t.Fatalf("watchFiles %v, want the policy file, from args", got)
	}
	// Run sets its watches up as it starts: the policy is written (each
	// time anew) until the change is seen, within a bound.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; cached() && time.Now().Before(deadline); i++ {
		if err := os.WriteFile(policy, []byte(fmt.Sprintf("keys: [] # %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if cached() {
		t.Fatal("the cached verdict survived a change of the plugin's policy file")
	}
	if n := reloads.Load(); n != 0 {
		t.Errorf("a change of a plugin's file reloaded the configuration %d times", n)
	}
}
