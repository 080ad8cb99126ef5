package rig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestRegistriesConfRewritesEveryNameToItsLocalRegistry(t *testing.T) {
	t.Parallel()
	conf := registriesConf(map[string]route{"gcr.io": {location: 5001}, "127.0.0.1:5000": {location: 5000}, "registry.rig.test": {location: 5000}})
	var got struct {
		Unqualified []string `toml:"unqualified-search-registries"`
		Registries  []struct {
			Prefix, Location string
			Insecure         bool
			Mirror           []any
		} `toml:"registry"`
	}
	if err := toml.Unmarshal([]byte(conf), &got); err != nil {
		t.Fatalf("%v\n%s", err, conf)
	}
	if len(got.Unqualified) != 0 {
		t.Errorf("unqualified-search-registries = %v: a short name must not be searched anywhere", got.Unqualified)
	}
	want := map[string]string{"127.0.0.1:5000": "127.0.0.1:5000", "gcr.io": "127.0.0.1:5001", "registry.rig.test": "127.0.0.1:5000"}
	if len(got.Registries) != len(want) {
		t.Fatalf("%d registries, want %d:\n%s", len(got.Registries), len(want), conf)
	}
	for _, r := range got.Registries {
		// A mirror would fall back to the name's own host on the internet.
		if want[r.Prefix] != r.Location || !r.Insecure || len(r.Mirror) != 0 {
			t.Errorf("%+v: want location %s, plain HTTP (insecure), no mirror", r, want[r.Prefix])
		}
	}
}

func TestCRIOConfigKeepsEverythingInTheRigsDirectory(t *testing.T) {
	t.Parallel()
	conf := crioConfig("/rig/crio", "/tools/crio", "/run/crio-rig", "overlay", "registry.k8s.io/pause:3.9")
	var c map[string]any
	if err := toml.Unmarshal([]byte(conf), &c); err != nil {
		t.Fatalf("%v\n%s", err, conf)
	}
	// Every path is the rig's, the tools' or the attach sockets'; the
	// runtimes' monitor is Debian's conmon.
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(prefix+"."+k, x)
			}
		case []any:
			for _, x := range v {
				walk(prefix, x)
			}
		case string:
			if strings.HasPrefix(v, "/") && !strings.HasPrefix(v, "/rig/crio/") && !strings.HasPrefix(v, "/tools/crio/") && v != "/run/crio-rig" && v != "/usr/bin/conmon" {
				t.Errorf("%s = %q: outside the rig", prefix, v)
			}
		}
	}
	walk("", c)
	for _, h := range crioHandlers {
		if !strings.Contains(conf, "[crio.runtime.runtimes."+h+"]") {
			t.Errorf("no runtime handler %s", h)
		}
	}
}

// On CRI-O, AddMirror and RemoveMirror change registries.conf and the
// proxy's hosts.toml files together (CRI-O is not running here: nothing to
// reload).
func TestCRIOMirrorsReachRegistriesConfAndTheProxysHostsDir(t *testing.T) {
	t.Parallel()
	r := &Rig{Dir: t.TempDir(), Runtime: Runtime{Kind: KindCRIO}, mirrors: map[string]route{"gcr.io": {location: 5001}}}
	if err := os.MkdirAll(r.crioDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if r.HostsDir() != "" || r.RegistriesConf() == "" {
		t.Errorf("HostsDir %q, RegistriesConf %q: CRI-O has registries.conf, no hosts directory", r.HostsDir(), r.RegistriesConf())
	}
	if flags := r.ProxyRegistryFlags(); len(flags) != 2 || flags[1] != r.proxyHostsDir() {
		t.Errorf("ProxyRegistryFlags = %q, want the proxy's hosts directory", flags)
	}
	read := func() (conf, hosts string) {
		b, err := os.ReadFile(r.RegistriesConf())
		if err != nil {
			t.Fatal(err)
		}
		h, _ := os.ReadFile(filepath.Join(r.proxyHostsDir(), "relay.test", "hosts.toml"))
		return string(b), string(h)
	}
	if err := r.AddMirror("relay.test", 6000); err != nil {
		t.Fatal(err)
	}
	if conf, hosts := read(); !strings.Contains(conf, `prefix = "relay.test"`+"\nlocation = \"127.0.0.1:6000\"") || !strings.Contains(hosts, `server = "http://127.0.0.1:6000"`) {
		t.Errorf("after AddMirror:\n%s\n%s", conf, hosts)
	}
	if err := r.RemoveMirror("relay.test"); err != nil {
		t.Fatal(err)
	}
	if conf, hosts := read(); strings.Contains(conf, "relay.test") || hosts != "" || !strings.Contains(conf, `prefix = "gcr.io"`) {
		t.Errorf("after RemoveMirror, relay.test is left or gcr.io gone:\n%s\n%s", conf, hosts)
	}
}

// SetMirror puts a mirror before a name's registry, on either runtime: in
// CRI-O's registries.conf and containerd's hosts.toml, and in the proxy's
// hosts.toml files on CRI-O, whose server stays the registry's; AddMirror
// takes it away again.
func TestSetMirrorPutsTheMirrorFirstAndKeepsTheServer(t *testing.T) {
	t.Parallel()
	type conf struct {
		Registries []struct {
			Prefix, Location string
			Insecure         bool
			Mirror           []struct {
				Location string
				Insecure bool
			}
		} `toml:"registry"`
	}
	type hosts struct {
		Server string
		Host   map[string]struct{ Capabilities []string }
	}
	// hostsOf reads name's hosts.toml in dir: the server and the hosts in
	// the file's order.
	hostsOf := func(t *testing.T, dir, name string) (server string, order []string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name, "hosts.toml"))
		if err != nil {
			t.Fatal(err)
		}
		var h hosts
		if err := toml.Unmarshal(b, &h); err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if host, ok := strings.CutPrefix(line, "[host."); ok {
				order = append(order, strings.Trim(host, `"]`))
			}
		}
		return h.Server, order
	}
	want := []string{"http://127.0.0.1:7001", "http://127.0.0.1:7000"}
	t.Run("crio", func(t *testing.T) {
		r := &Rig{Dir: t.TempDir(), Runtime: Runtime{Kind: KindCRIO}, mirrors: map[string]route{"registry.test": {location: 7000}}}
		if err := os.MkdirAll(r.crioDir(), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := r.SetMirror("registry.test", 7001, 7000); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(r.RegistriesConf())
		if err != nil {
			t.Fatal(err)
		}
		var c conf
		if err := toml.Unmarshal(b, &c); err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		if len(c.Registries) != 1 || c.Registries[0].Location != "127.0.0.1:7000" || len(c.Registries[0].Mirror) != 1 ||
			c.Registries[0].Mirror[0].Location != "127.0.0.1:7001" || !c.Registries[0].Mirror[0].Insecure {
			t.Errorf("registries.conf: want registry.test at 127.0.0.1:7000 after the plain-HTTP mirror 127.0.0.1:7001:\n%s", b)
		}
		if server, order := hostsOf(t, r.proxyHostsDir(), "registry.test"); server != "http://127.0.0.1:7000" || !slices.Equal(order, want) {
			t.Errorf("the proxy's hosts.toml: server %s, hosts %v; want the registry as server, the mirror first", server, order)
		}
		if err := r.AddMirror("registry.test", 7000); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(r.RegistriesConf()); strings.Contains(string(b), "7001") {
			t.Errorf("AddMirror left the mirror:\n%s", b)
		}
		if _, order := hostsOf(t, r.proxyHostsDir(), "registry.test"); !slices.Equal(order, want[1:]) {
			t.Errorf("AddMirror left the proxy's hosts %v", order)
		}
	})
	t.Run("containerd", func(t *testing.T) {
		r := &Rig{Dir: t.TempDir(), ContainerdSock: filepath.Join(t.TempDir(), "containerd.sock")}
		if err := r.SetMirror("registry.test", 7001, 7000); err != nil {
			t.Fatal(err)
		}
		if server, order := hostsOf(t, r.HostsDir(), "registry.test"); server != "http://127.0.0.1:7000" || !slices.Equal(order, want) {
			t.Errorf("hosts.toml: server %s, hosts %v; want the registry as server, the mirror first", server, order)
		}
		if err := r.AddMirror("registry.test", 7000); err != nil {
			t.Fatal(err)
		}
		if _, order := hostsOf(t, r.HostsDir(), "registry.test"); !slices.Equal(order, want[1:]) {
			t.Errorf("AddMirror left the hosts %v", order)
		}
	})
}

func TestCRIOAttachSocketsFitAUnixSocketPath(t *testing.T) {
	t.Parallel()
	// The longest rig directory os.MkdirTemp makes under the default base.
	sock := filepath.Join(crioAttachDir("/tmp/cri-image-proxy-rig/r4294967295"), strings.Repeat("f", 64), "attach")
	if len(sock) > 107 {
		t.Errorf("%s: %d bytes, a unix socket path holds 107", sock, len(sock))
	}
}
