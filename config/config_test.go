package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	t.Run("a full file decodes field by field", func(t *testing.T) {
		c, err := Load(filepath.Join("testdata", "full.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		want := Default()
		want.Socket.Group = "0"
		want.ImageEndpoint = "unix:///run/containerd/containerd.sock"
		want.ShutdownTimeout.Duration = 45 * time.Second
		want.Logging = Logging{Level: "debug", Format: "json"}
		want.CredentialProviders = &CredentialProviders{
			Config: "/etc/kubernetes/credential-providers.yaml", BinDir: "/usr/libexec/kubernetes/kubelet-plugins/credential-provider/exec",
			CacheSize: DefaultPluginCacheSize,
		}
		want.CredentialProviders.ExecTimeout.Duration = 30 * time.Second
		want.CredentialProviders.CachePurgeInterval.Duration = DefaultPluginCachePurgeInterval
		want.Kubernetes = &Kubernetes{Kubeconfig: "/etc/cri-image-proxy/kubeconfig", NodeName: "node-a", QPS: 20, Burst: DefaultKubernetesBurst}
		want.ImagePolicy = &ImagePolicy{Config: "/etc/cri-image-proxy/image-policy.d", BinDir: "/usr/libexec/cri-image-proxy/policy", CacheSize: 512}
		want.ImagePolicy.CachePurgeInterval.Duration = DefaultPluginCachePurgeInterval
		want.RegistryCheck = RegistryCheck{
			HostsDir: "/etc/containerd/certs.d", MaxProofBytes: resource.MustParse("512Mi"), MaxProofUncompressedBytes: resource.MustParse("3Gi"), MaxProofParallel: 2,
			VouchedMirrors: []VouchedMirror{{Registry: "docker.io", Endpoint: "https://mirror.example"}},
		}
		want.RegistryCheck.Timeout.Duration = 20 * time.Second
		want.RegistryCheck.ProofTimeout.Duration = 30 * time.Minute
		if diff := cmp.Diff(want, c); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("a minimal file gets every default", func(t *testing.T) {
		c, err := Load(filepath.Join("testdata", "minimal.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(Default(), c); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	})
	t.Run("a missing file names its path", func(t *testing.T) {
		_, err := Load("testdata/nope.yaml")
		if err == nil || !strings.Contains(err.Error(), "testdata/nope.yaml") {
			t.Errorf("got %v", err)
		}
	})
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	head := "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"a misspelt field is refused by name", head + "sockt: {}\n", `unknown field "sockt"`},
		{"a misspelt nested field is refused by name", head + "socket: {pth: /x}\n", `unknown field "socket.pth"`},
		{"another kind is refused", "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: KubeletConfiguration\n", `"KubeletConfiguration"`},
		{"a missing apiVersion is refused", "kind: ProxyConfiguration\n", `apiVersion/kind`},
		{"a bad duration is refused", head + "shutdownTimeout: soon\n", `soon`},
		{"a wrong type is refused", head + "socket: [1]\n", `socket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestTheDecompressedProofBoundFollowsTheCompressedOne: left out, the
// decompressed bound of a layer proof is 4 times the compressed one in
// effect, the file's or the default.
func TestTheDecompressedProofBoundFollowsTheCompressedOne(t *testing.T) {
	t.Parallel()
	head := "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"with neither set, 4 times the default 8Gi", head, "32Gi"},
		{"with the compressed bound set, 4 times it", head + "registryCheck:\n  maxProofBytes: 512Mi\n", "2Gi"},
		{"set, it is as set", head + "registryCheck:\n  maxProofBytes: 512Mi\n  maxProofUncompressedBytes: 1Gi\n", "1Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Decode([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := c.RegistryCheck.MaxProofUncompressedBytes; got.Cmp(resource.MustParse(tc.want)) != 0 {
				t.Errorf("maxProofUncompressedBytes %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*ProxyConfiguration)
		want   []string // each must appear in the error
	}{
		{"the defaults are valid", func(*ProxyConfiguration) {}, nil},
		{"a relative socket path names the field", func(c *ProxyConfiguration) { c.Socket.Path = "proxy.sock" }, []string{"socket.path", "absolute"}},
		{"a tcp runtime endpoint names the field", func(c *ProxyConfiguration) { c.RuntimeEndpoint = "tcp://1.2.3.4:5" }, []string{"runtimeEndpoint", "unix"}},
		{"a relative unix endpoint names the field", func(c *ProxyConfiguration) { c.ImageEndpoint = "unix://run/x.sock" }, []string{"imageEndpoint", "absolute"}},
		{"forwarding to itself is refused", func(c *ProxyConfiguration) { c.RuntimeEndpoint = "unix://" + c.Socket.Path }, []string{"socket.path", "itself"}},
		{"a monitoring address without port names the field", func(c *ProxyConfiguration) { c.Monitoring.Address = "localhost" }, []string{"monitoring.address"}},
		{"monitoring can be turned off", func(c *ProxyConfiguration) { c.Monitoring.Address = "-" }, nil},
		{"an unknown log level lists the supported ones", func(c *ProxyConfiguration) { c.Logging.Level = "loud" }, []string{"logging.level", `"debug"`}},
		{"a negative shutdown timeout names the field", func(c *ProxyConfiguration) { c.ShutdownTimeout.Duration = -time.Second }, []string{"shutdownTimeout"}},
		{"every problem is reported at once", func(c *ProxyConfiguration) { c.Socket.Path = "x"; c.Logging.Format = "xml" }, []string{"socket.path", "logging.format"}},
		{"credential providers need a config and a bin directory", func(c *ProxyConfiguration) { c.CredentialProviders = &CredentialProviders{} },
			[]string{"credentialProviders.config: Required value", "credentialProviders.binDir: Required value"}},
		{"credential provider paths must be absolute", func(c *ProxyConfiguration) {
			c.CredentialProviders = &CredentialProviders{Config: "providers.yaml", BinDir: "/usr/libexec/plugins"}
		}, []string{"credentialProviders.config: Invalid value"}},
		{"a negative exec timeout names the field", func(c *ProxyConfiguration) {
			c.CredentialProviders = &CredentialProviders{Config: "/etc/p.yaml", BinDir: "/bin"}
			c.CredentialProviders.ExecTimeout.Duration = -1
		}, []string{"credentialProviders.execTimeout"}},
		{"image policy needs a config and a bin directory, absolute", func(c *ProxyConfiguration) { c.ImagePolicy = &ImagePolicy{Config: "policy.yaml"} },
			[]string{"imagePolicy.config: Invalid value", "imagePolicy.binDir: Required value"}},
		{"image policy's cache bounds must not be negative", func(c *ProxyConfiguration) {
			c.ImagePolicy = &ImagePolicy{Config: "/etc/p.yaml", BinDir: "/bin", CacheSize: -1}
			c.ImagePolicy.CachePurgeInterval.Duration = -1
		}, []string{"imagePolicy.cacheSize", "imagePolicy.cachePurgeInterval"}},
		{"a registry named twice among the vouched mirrors is refused, docker.io and index.docker.io being one", func(c *ProxyConfiguration) {
			c.RegistryCheck.VouchedMirrors = []VouchedMirror{
				{Registry: "docker.io", Endpoint: "https://mirror-a.example"}, {Registry: "index.docker.io", Endpoint: "https://mirror-b.example"},
			}
		}, []string{"registryCheck.vouchedMirrors", "named twice"}},
		{"a vouched mirror's endpoint with a password is refused without showing it", func(c *ProxyConfiguration) {
			c.RegistryCheck.VouchedMirrors = []VouchedMirror{{Registry: "docker.io", Endpoint: "https://user:hunter22@mirror.example"}}
		}, []string{"registryCheck.vouchedMirrors[0]", "no user", "xxxxx"}},
		{"a relative registry hosts directory names the field", func(c *ProxyConfiguration) {
			c.RegistryCheck.HostsDir = "/etc/containerd/certs.d:certs.d"
		}, []string{"registryCheck.hostsDir", "absolute"}},
		{"a relative registries.conf path names the field", func(c *ProxyConfiguration) {
			c.RegistryCheck.RegistriesConf = "registries.conf"
		}, []string{"registryCheck.registriesConf", "absolute"}},
		{"a certs.d directory without registries.conf is refused: containerd's TLS settings are in hostsDir", func(c *ProxyConfiguration) {
			c.RegistryCheck.CertsDir = "/etc/containers/certs.d"
		}, []string{"registryCheck.certsDir", "only with registriesConf"}},
		{"a relative certs.d directory names the field", func(c *ProxyConfiguration) {
			c.RegistryCheck.RegistriesConf, c.RegistryCheck.CertsDir = "/etc/containers/registries.conf", "/etc/containers/certs.d:certs.d"
		}, []string{"registryCheck.certsDir", "absolute"}},
		{"negative registry check bounds name their fields", func(c *ProxyConfiguration) {
			c.RegistryCheck.Timeout.Duration = -1
			c.RegistryCheck.ProofTimeout.Duration = -1
			c.RegistryCheck.MaxProofBytes = resource.MustParse("-1Gi")
			c.RegistryCheck.MaxProofUncompressedBytes = resource.MustParse("-1Gi")
			c.RegistryCheck.MaxProofParallel = -1
		}, []string{"registryCheck.timeout", "registryCheck.proofTimeout", "registryCheck.maxProofBytes", "registryCheck.maxProofUncompressedBytes", "registryCheck.maxProofParallel"}},
		{"a decompressed proof bound under the compressed one names both", func(c *ProxyConfiguration) {
			c.RegistryCheck.MaxProofBytes = resource.MustParse("8Gi")
			c.RegistryCheck.MaxProofUncompressedBytes = resource.MustParse("32Mi")
		}, []string{"registryCheck.maxProofUncompressedBytes", "32Mi", "at least maxProofBytes (8Gi)"}},
		{"a relative kubeconfig names the field", func(c *ProxyConfiguration) {
			c.Kubernetes = &Kubernetes{Kubeconfig: "kubeconfig", NodeName: "n", QPS: 1, Burst: 1}
		}, []string{"kubernetes.kubeconfig: Invalid value"}},
		{"a Kubernetes section needs the node's name", func(c *ProxyConfiguration) {
			c.Kubernetes = &Kubernetes{QPS: 1, Burst: 1}
		}, []string{"kubernetes.nodeName: Required value"}},
		{"negative rate limits name their fields", func(c *ProxyConfiguration) {
			c.Kubernetes = &Kubernetes{NodeName: "n", QPS: -1, Burst: -1}
		}, []string{"kubernetes.qps", "kubernetes.burst"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.change(c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want valid", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got valid, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "hunter22") {
				t.Errorf("error %q shows a password", err)
			}
		})
	}
}

func TestDeployedExampleLoads(t *testing.T) {
	t.Parallel()
	c, err := Load(filepath.Join("..", "deploy", "examples", "proxy-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Default(), c); diff != "" {
		t.Errorf("the example no longer shows the defaults (-defaults +example):\n%s", diff)
	}
}

// TestTheRegistryChecksDeprecatedFields: ensureSecretPulledImages'
// registryHostsDir and vouchedMirrors, where the registry check's settings
// were, are still read (a node's file does not break), named as deprecated,
// and refused when the registry check's own section says otherwise.
func TestTheRegistryChecksDeprecatedFields(t *testing.T) {
	t.Parallel()
	head := "apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ProxyConfiguration\n"
	oldPlace := "ensureSecretPulledImages:\n  registryHostsDir: /etc/old/certs.d\n  vouchedMirrors: [{registry: docker.io, endpoint: \"https://mirror.example\"}]\n"
	mirror := []VouchedMirror{{Registry: "docker.io", Endpoint: "https://mirror.example"}}
	for _, tc := range []struct {
		name        string
		yaml        string
		wantErr     []string // each must appear in the error; none: valid
		wantHosts   string
		wantMirrors []VouchedMirror
		deprecated  int
	}{
		{"the old place alone is the registry check's, with a warning for each field", head + oldPlace, nil, "/etc/old/certs.d", mirror, 2},
		{"the old place and the new agreeing are valid, with the warnings", head + oldPlace +
			"registryCheck:\n  hostsDir: /etc/old/certs.d\n  vouchedMirrors: [{registry: docker.io, endpoint: \"https://mirror.example\"}]\n",
			nil, "/etc/old/certs.d", mirror, 2},
		{"the new place alone has no warning", head + "registryCheck:\n  hostsDir: /etc/new/certs.d\n", nil, "/etc/new/certs.d", nil, 0},
		{"the two places disagreeing is an error naming both fields", head + oldPlace +
			"registryCheck:\n  hostsDir: /etc/new/certs.d\n  vouchedMirrors: []\n",
			[]string{"ensureSecretPulledImages.registryHostsDir", "registryCheck.hostsDir", "ensureSecretPulledImages.vouchedMirrors", "registryCheck.vouchedMirrors"}, "", nil, 2},
		{"a bad value at the old place is named there", head + "ensureSecretPulledImages:\n  registryHostsDir: certs.d\n",
			[]string{"ensureSecretPulledImages.registryHostsDir: Invalid value: \"certs.d\": must be absolute"}, "", nil, 1},
		{"a bad mirror at the old place is named there, its password hidden", head + "ensureSecretPulledImages:\n  vouchedMirrors: [{registry: docker.io, endpoint: \"https://u:hunter22@m.example\"}]\n",
			[]string{"ensureSecretPulledImages.vouchedMirrors[0]"}, "", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Decode([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(c.Deprecations()); got != tc.deprecated {
				t.Errorf("%d deprecations %v, want %d", got, c.Deprecations(), tc.deprecated)
			}
			err = c.Validate()
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("valid, want an error containing %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "hunter22") {
					t.Errorf("error %q shows a password", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.RegistryCheck.HostsDir != tc.wantHosts || !cmp.Equal(c.RegistryCheck.VouchedMirrors, tc.wantMirrors) {
				t.Errorf("registry check %+v, want hosts %s and mirrors %v", c.RegistryCheck, tc.wantHosts, tc.wantMirrors)
			}
			// What the old place said, the new one says alone.
			c.DropDeprecated()
			if len(c.Deprecations()) != 0 || c.Validate() != nil || c.RegistryCheck.HostsDir != tc.wantHosts {
				t.Errorf("after DropDeprecated: %v, %v, %+v", c.Deprecations(), c.Validate(), c.RegistryCheck)
			}
		})
	}
}
