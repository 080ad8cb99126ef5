package credplugins

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

func TestReload(t *testing.T) {
	ctx := context.Background()
	clk := testclock.NewFakeClock(time.Now())
	reg := prometheus.NewRegistry()
	keep, change, drop := &fakeRunner{auth: cred, keyType: credentialproviderapi.ImagePluginCacheKeyType}, &fakeRunner{auth: cred, keyType: credentialproviderapi.ImagePluginCacheKeyType}, &fakeRunner{auth: cred, keyType: credentialproviderapi.ImagePluginCacheKeyType}
	cfg := &Config{Hash: "sha256:one", Providers: []Provider{
		prov("keep", time.Hour, nil, "registry.test/keep").cfg,
		prov("change", time.Hour, nil, "registry.test/change").cfg,
		prov("drop", time.Hour, nil, "registry.test/drop").cfg,
	}}
	in, err := New(cfg, Options{Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []*fakeRunner{keep, change, drop} {
		in.plugins()[i].Runner = r
	}
	for _, img := range []string{"registry.test/keep/app", "registry.test/change/app", "registry.test/drop/app"} {
		in.Lookup(ctx, img, nil)
	}

	next := &Config{Hash: "sha256:two", Providers: []Provider{
		prov("keep", time.Hour, nil, "registry.test/keep").cfg,
		prov("change", time.Hour, nil, "registry.test/change", "registry.test/more").cfg,
		prov("new", time.Hour, nil, "registry.test/new").cfg,
	}}
	rep, err := in.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	changed, added := &fakeRunner{auth: cred, keyType: credentialproviderapi.ImagePluginCacheKeyType}, &fakeRunner{auth: cred, keyType: credentialproviderapi.ImagePluginCacheKeyType}
	in.plugins()[1].Runner, in.plugins()[2].Runner = changed, added

	t.Run("an unchanged provider keeps its plugin and cache; the others are new or gone", func(t *testing.T) {
		if strings.Join(rep.Kept, ",") != "keep" || strings.Join(rep.Changed, ",") != "change" || strings.Join(rep.Added, ",") != "new" || strings.Join(rep.Removed, ",") != "drop" {
			t.Fatalf("report %+v", rep)
		}
		in.Lookup(ctx, "registry.test/keep/app", nil)
		if n := keep.runs.Load(); n != 1 {
			t.Errorf("the kept provider ran %d times, want 1 (its cached answer)", n)
		}
		in.Lookup(ctx, "registry.test/change/app", nil)
		if n := changed.runs.Load(); n != 1 {
			t.Errorf("the changed provider ran %d times, want 1 (its cache starts empty)", n)
		}
		if c, _, _ := in.Lookup(ctx, "registry.test/drop/app", nil); len(c) != 0 || drop.runs.Load() != 1 {
			t.Errorf("the removed provider still answers: %v", c)
		}
	})

	t.Run("the metrics show the new configuration's hash and providers", func(t *testing.T) {
		want := `
# HELP cri_image_proxy_credential_provider_config_info Hash of the credential provider configuration in use, as a label (the kubelet's credential_provider_config_info).
# TYPE cri_image_proxy_credential_provider_config_info gauge
cri_image_proxy_credential_provider_config_info{hash="sha256:two"} 1
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "cri_image_proxy_credential_provider_config_info"); err != nil {
			t.Error(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		plugins := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "cri_image_proxy_credential_cache_entries" {
				for _, m := range mf.GetMetric() {
					plugins[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		if plugins["keep"] != 1 || len(plugins) != 3 {
			t.Errorf("cache entries by plugin: %v, want keep (1 entry), change and new", plugins)
		}
		if _, ok := plugins["drop"]; ok {
			t.Errorf("the removed provider's cache is still reported")
		}
	})

	t.Run("a configuration New would refuse is refused, and the current one keeps serving", func(t *testing.T) {
		bad := &Config{Hash: "sha256:bad", Providers: []Provider{prov("tokens", time.Hour, nil, "registry.test").cfg}}
		bad.Providers[0].TokenAttributes = &TokenAttributes{ServiceAccountTokenAudience: "a"}
		if _, err := in.Reload(bad); err == nil || !strings.Contains(err.Error(), "tokens") {
			t.Fatalf("got %v, want the provider named", err)
		}
		if in.Config().Hash != "sha256:two" {
			t.Errorf("config after a refused reload: %s", in.Config().Hash)
		}
	})

	t.Run("a lookup that started before a reload finishes with the providers it started with", func(t *testing.T) {
		gate := make(chan struct{})
		slow := &fakeRunner{auth: cred, gate: gate, keyType: credentialproviderapi.ImagePluginCacheKeyType}
		in.plugins()[2].Runner = slow // "new"
		done := make(chan []Candidate)
		go func() { c, _, _ := in.Lookup(ctx, "registry.test/new/app", nil); done <- c }()
		for slow.runs.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		if _, err := in.Reload(&Config{Hash: "sha256:three"}); err != nil {
			t.Fatal(err)
		}
		close(gate)
		if c := <-done; len(c) != 1 {
			t.Errorf("the lookup in flight got %d candidates, want its provider's 1", len(c))
		}
		if c, _, _ := in.Lookup(ctx, "registry.test/new/app", nil); len(c) != 0 {
			t.Errorf("a lookup after the reload still used the removed provider")
		}
	})
}

func TestDefinitionCoversTheExecutable(t *testing.T) {
	dir := t.TempDir()
	p := prov("plugin", time.Minute, nil, "registry.test").cfg
	testkit.WritePlugin(t, dir, "plugin", "echo v1\n")
	a, _ := definition(p, dir)
	p.File = "elsewhere.yaml"
	b, _ := definition(p, dir)
	testkit.WritePlugin(t, dir, "plugin", "echo v2\n")
	c, _ := definition(p, dir)
	if a != b {
		t.Errorf("moving a provider to another file changed its definition")
	}
	if b == c {
		t.Errorf("replacing the executable did not change the definition")
	}
}
