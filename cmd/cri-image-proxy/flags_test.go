package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/cri-image-proxy/cri-image-proxy/config"
)

func TestFlagsOverTheConfigurationFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "proxy.yaml")
	os.WriteFile(file, []byte(`apiVersion: `+config.APIVersion+`
kind: `+config.Kind+`
socket: {path: /run/from-file.sock}
shutdownTimeout: 7s
kubernetes: {kubeconfig: /etc/from-file.kubeconfig}
ensureSecretPulledImages: {enabled: true, imagePullCredentialsVerificationPolicy: AlwaysVerify}
`), 0o600)
	for _, tc := range []struct {
		name  string
		args  []string
		check func(*config.ProxyConfiguration) string
	}{
		{"without a file, flags set the fields and make their sections present", []string{"--socket", "/run/x.sock", "--kubeconfig", "/k", "--log-level", "debug"},
			func(c *config.ProxyConfiguration) string {
				if c.Socket.Path != "/run/x.sock" || c.Kubernetes == nil || c.Kubernetes.Kubeconfig != "/k" || c.Logging.Level != "debug" || c.CredentialProviders != nil {
					return "fields or sections wrong"
				}
				return ""
			}},
		{"the providers' flags make their section present, with its defaults", []string{"--image-credential-provider-config", "/etc/p.yaml", "--image-credential-provider-bin-dir", "/opt/bin"},
			func(c *config.ProxyConfiguration) string {
				if c.CredentialProviders == nil || c.CredentialProviders.BinDir != "/opt/bin" || c.CredentialProviders.CacheSize != config.DefaultPluginCacheSize || c.Kubernetes != nil || c.Monitoring.Secure != nil {
					return "sections wrong"
				}
				return ""
			}},
		{"without a file or flags, the defaults, and no optional section", nil,
			func(c *config.ProxyConfiguration) string {
				d := config.Default()
				if c.Socket.Path != d.Socket.Path || c.Kubernetes != nil || c.CredentialProviders != nil || c.EnsureSecretPulledImages.Enabled {
					return "not the defaults"
				}
				return ""
			}},
		{"the file's values stay where no flag is given", []string{"--config", file},
			func(c *config.ProxyConfiguration) string {
				if c.Socket.Path != "/run/from-file.sock" || c.ShutdownTimeout.Duration != 7*time.Second || c.Kubernetes.Kubeconfig != "/etc/from-file.kubeconfig" || c.EnsureSecretPulledImages.ImagePullCredentialsVerificationPolicy != "AlwaysVerify" {
					return "the file's values were lost"
				}
				return ""
			}},
		{"a flag the user set overrides the file, the rest of the file stays", []string{"--config", file, "--socket", "/run/flag.sock", "--image-pull-credentials-verification-policy", "NeverVerify", "--node-name", "n1"},
			func(c *config.ProxyConfiguration) string {
				if c.Socket.Path != "/run/flag.sock" || c.EnsureSecretPulledImages.ImagePullCredentialsVerificationPolicy != "NeverVerify" ||
					c.Kubernetes.NodeName != "n1" || c.Kubernetes.Kubeconfig != "/etc/from-file.kubeconfig" || c.ShutdownTimeout.Duration != 7*time.Second {
					return "override wrong"
				}
				return ""
			}},
		{"a flag set to its default still overrides the file", []string{"--config", file, "--shutdown-timeout", config.Default().ShutdownTimeout.Duration.String()},
			func(c *config.ProxyConfiguration) string {
				if c.ShutdownTimeout.Duration != config.Default().ShutdownTimeout.Duration {
					return "the file won over an explicit flag"
				}
				return ""
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newServeCmd()
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadServeConfig(cmd.Flags(), cmd.Flags().Lookup("config").Value.String())
			if err != nil {
				t.Fatal(err)
			}
			if why := tc.check(cfg); why != "" {
				t.Errorf("%s: %+v", why, cfg)
			}
		})
	}
	t.Run("the registry hosts flag overrides the file's, at its deprecated place too", func(t *testing.T) {
		old := filepath.Join(t.TempDir(), "old.yaml")
		os.WriteFile(old, []byte("apiVersion: "+config.APIVersion+"\nkind: "+config.Kind+"\nensureSecretPulledImages: {registryHostsDir: /etc/from-file/certs.d}\n"), 0o600)
		for _, tc := range []struct {
			args       []string
			want       string
			deprecated int
		}{
			{[]string{"--config", old}, "/etc/from-file/certs.d", 1},
			{[]string{"--config", old, "--registry-hosts-dir", "/etc/flag/certs.d"}, "/etc/flag/certs.d", 0},
			{[]string{"--registry-hosts-dir", "/etc/flag/certs.d"}, "/etc/flag/certs.d", 0},
		} {
			cmd := newServeCmd()
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadServeConfig(cmd.Flags(), cmd.Flags().Lookup("config").Value.String())
			if err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			if cfg.RegistryCheck.HostsDir != tc.want || len(cfg.Deprecations()) != tc.deprecated {
				t.Errorf("%v: hosts dir %q and deprecations %v, want %q and %d", tc.args, cfg.RegistryCheck.HostsDir, cfg.Deprecations(), tc.want, tc.deprecated)
			}
		}
	})
	t.Run("an invalid value is refused naming the flag", func(t *testing.T) {
		cmd := newServeCmd()
		cmd.ParseFlags([]string{"--image-pull-credentials-verification-policy", "Sometimes"})
		_, err := loadServeConfig(cmd.Flags(), "")
		if err == nil || !strings.Contains(err.Error(), "imagePullCredentialsVerificationPolicy") {
			t.Errorf("got %v", err)
		}
	})
}

// TestOptionalSectionsAndTheirFlags: the flags that make an optional
// section present are exactly its own.
func TestOptionalSectionsAndTheirFlags(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	var got [][]string
	for _, s := range bindServeFlags(pflag.NewFlagSet("serve", pflag.ContinueOnError), cfg) {
		got = append(got, s.flags)
	}
	want := [][]string{
		{"image-credential-provider-bin-dir", "image-credential-provider-config"},
		{"image-policy-bin-dir", "image-policy-config"},
		{"kubeconfig", "node-name"},
		{"secure-monitoring-address", "tls-cert-file", "tls-private-key-file"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sections' flags %v, want %v", got, want)
	}
	if cfg.CredentialProviders == nil || cfg.ImagePolicy == nil || cfg.Kubernetes == nil || cfg.Monitoring.Secure == nil {
		t.Errorf("a section was not allocated for its flags: %+v", cfg)
	}
}
