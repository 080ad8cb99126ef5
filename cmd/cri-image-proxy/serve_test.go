package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

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
	t.Run("an invalid value is refused naming the flag", func(t *testing.T) {
		cmd := newServeCmd()
		cmd.ParseFlags([]string{"--image-pull-credentials-verification-policy", "Sometimes"})
		_, err := loadServeConfig(cmd.Flags(), "")
		if err == nil || !strings.Contains(err.Error(), "imagePullCredentialsVerificationPolicy") {
			t.Errorf("got %v", err)
		}
	})
}

func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(buildInfoMetric())
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || families[0].GetName() != "cri_image_proxy_build_info" {
		t.Fatalf("gathered %v, %v", families, err)
	}
	m := families[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["version"] != version || labels["goversion"] == "" || labels["cri_api"] == "" {
		t.Errorf("build_info %v = %v", labels, m.GetGauge().GetValue())
	}
}

// TestClientGoLogsThroughTheDaemonsHandler: what client-go logs (through
// klog) comes out in the daemon's format, JSON included, and its level
// filter applies.
func TestClientGoLogsThroughTheDaemonsHandler(t *testing.T) {
	var buf bytes.Buffer
	newLogger(config.Logging{Level: "info", Format: "json"}, &buf)
	defer klog.ClearLogger()
	klog.ErrorS(errors.New("connection refused"), "Failed to watch", "reflector", "pods")
	klog.V(4).InfoS("a detail below the level")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line, got %d:\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("klog's line is not JSON: %v\n%s", err, lines[0])
	}
	if rec["msg"] != "Failed to watch" || rec["level"] != "ERROR" || rec["reflector"] != "pods" {
		t.Errorf("klog's line: %v", rec)
	}
}

func TestAdminSocketAccess(t *testing.T) {
	t.Parallel()
	t.Run("without an admin group: root only, mode 0600", func(t *testing.T) {
		callers, opts, err := adminSocketAccess("", nil)
		if err != nil || callers.HasGroup || opts.Mode != 0o600 || opts.Group != "" {
			t.Errorf("callers %v, options %+v, err %v", callers, opts, err)
		}
	})
	t.Run("with an admin group: root and that group, mode 0660 of that group", func(t *testing.T) {
		callers, opts, err := adminSocketAccess("4242", nil)
		if err != nil || !callers.HasGroup || callers.Group != 4242 || opts.Mode != 0o660 || opts.Group != "4242" {
			t.Errorf("callers %v, options %+v, err %v", callers, opts, err)
		}
	})
	t.Run("an unknown group is refused naming the field", func(t *testing.T) {
		_, _, err := adminSocketAccess("no-such-group-for-cri-image-proxy", nil)
		if err == nil || !strings.Contains(err.Error(), "ensureSecretPulledImages.adminGroup") {
			t.Errorf("got %v", err)
		}
	})
}
