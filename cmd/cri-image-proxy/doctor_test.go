package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/config"
)

func TestDoctor(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	const socket = "/run/cri-image-proxy/cri-image-proxy.sock"
	// A kubelet as /proc shows it: pid 42, --config relative to its cwd.
	proc := t.TempDir()
	kubelet := func(endpoint string) {
		dir := filepath.Join(proc, "42")
		os.MkdirAll(filepath.Join(dir, "root", "var", "lib", "kubelet"), 0o755)
		os.WriteFile(filepath.Join(dir, "comm"), []byte("kubelet\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "cmdline"), []byte("/usr/bin/kubelet\x00--config\x00config.yaml\x00"), 0o644)
		os.Remove(filepath.Join(dir, "cwd"))
		os.Symlink("/var/lib/kubelet", filepath.Join(dir, "cwd"))
		os.WriteFile(filepath.Join(dir, "root", "var", "lib", "kubelet", "config.yaml"), []byte("containerRuntimeEndpoint: "+endpoint+"\n"), 0o644)
	}
	metrics := func(v float64) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "# TYPE cri_image_proxy_client_last_call_timestamp_seconds gauge\ncri_image_proxy_client_last_call_timestamp_seconds{client=\"kubelet\"} %v\ncri_image_proxy_client_last_call_timestamp_seconds{client=\"other\"} 1\n", v)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	tests := []struct {
		name      string
		endpoint  string
		address   string
		problems  int
		wantLines []string
	}{
		{"a kubelet on the proxy's socket that called a second ago is fine", "unix://" + socket, metrics(float64(now.Unix() - 1)), 0,
			[]string{"ok    runtime endpoint: unix://" + socket + " (/var/lib/kubelet/config.yaml containerRuntimeEndpoint)", "ok    image endpoint", "ok    last kubelet call: 1s ago"}},
		{"a kubelet on containerd's socket bypasses the proxy, and the fix names the file and field", "unix:///run/containerd/containerd.sock", metrics(float64(now.Unix() - 1)), 2,
			[]string{"FAIL  runtime endpoint: unix:///run/containerd/containerd.sock", "Set containerRuntimeEndpoint: unix://" + socket + " in /var/lib/kubelet/config.yaml"}},
		{"a kubelet that stopped calling is a problem", "unix://" + socket, metrics(float64(now.Unix() - 600)), 1,
			[]string{"FAIL  last kubelet call: 10m0s ago"}},
		{"a kubelet that never called is a problem", "unix://" + socket, metrics(0), 1,
			[]string{"FAIL  last kubelet call: never"}},
		{"without monitoring the last call is unknown, not a problem", "unix://" + socket, "-", 0,
			[]string{"warn  last kubelet call: unknown, the proxy's monitoring is off"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kubelet(tt.endpoint) // the subtests run one after the other
			cfg := config.Default()
			cfg.Monitoring.Address = tt.address
			var out bytes.Buffer
			if n := doctor(context.Background(), &out, cfg, proc, 0, now); n != tt.problems {
				t.Errorf("%d problems, want %d:\n%s", n, tt.problems, out.String())
			}
			for _, want := range tt.wantLines {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestDoctorRegistryCheck(t *testing.T) {
	t.Parallel()
	regconf, err := filepath.Abs(filepath.Join("..", "..", "registry", "testdata", "registries.conf"))
	if err != nil {
		t.Fatal(err)
	}
	hostsDir := t.TempDir()
	os.MkdirAll(filepath.Join(hostsDir, "registry.example"), 0o755)
	os.WriteFile(filepath.Join(hostsDir, "registry.example", "hosts.toml"), []byte("server = \"https://registry.example:8443\"\n\n[host.\"https://mirror.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n"), 0o644)
	badCerts := t.TempDir()
	os.MkdirAll(filepath.Join(badCerts, "registry.example"), 0o755)
	os.WriteFile(filepath.Join(badCerts, "registry.example", "client.cert"), []byte("x"), 0o644)
	for _, tc := range []struct {
		name      string
		set       func(*config.RegistryCheck)
		problems  int
		wantLines []string
	}{
		{"on a CRI-O node it names registries.conf and what the check makes of each registry", func(r *config.RegistryCheck) {
			r.RegistriesConf, r.CertsDir = regconf, t.TempDir()
		}, 0, []string{
			"ok    registry check: reads CRI-O's registries.conf (" + regconf + "): " + regconf + ", ",
			"registry.example (" + filepath.Join(filepath.Dir(regconf), "registries.conf.d", "10-override.conf") + "): asks https://registry.example/v2; never asked: cache.example",
			"blocked.example (" + regconf + "): blocked: checks are refused",
			"insecure.example:5000 (" + regconf + "): asks https://insecure.example:5000/v2, its certificate not verified, then plain http",
			"public.example (" + regconf + "): asks https://public.example/v2; never asked: internal.example/public (the location, on another host)",
			"repository moved: moved.example/old-team → moved.example/new-team",
			"docker.io (" + regconf + "): asks https://registry-1.docker.io/v2; never asked: hub-mirror.example",
		}},
		{"a registries.conf that does not parse is a problem naming the file", func(r *config.RegistryCheck) {
			r.RegistriesConf = filepath.Join(filepath.Dir(regconf), "malformed", "syntax.conf")
		}, 1, []string{"FAIL  registry check: registries configuration " + filepath.Join(filepath.Dir(regconf), "malformed", "syntax.conf") + ": line 2"}},
		{"a registry whose TLS files are wrong is a problem", func(r *config.RegistryCheck) {
			r.RegistriesConf, r.CertsDir = regconf, badCerts
		}, 1, []string{"FAIL  registry.example (", "client.cert has no key client.key"}},
		{"on a containerd node it names the hosts directories, each server, and the mirrors never asked", func(r *config.RegistryCheck) {
			r.HostsDir = hostsDir
		}, 0, []string{
			"ok    registry check: reads containerd's hosts.toml under " + hostsDir,
			"registry.example (" + filepath.Join(hostsDir, "registry.example", "hosts.toml") + "): asks https://registry.example:8443/v2; never asked: https://mirror.example/v2",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			tc.set(&cfg.RegistryCheck)
			var out bytes.Buffer
			if n := doctorRegistryCheck(context.Background(), &out, cfg); n != tc.problems {
				t.Errorf("%d problems, want %d:\n%s", n, tc.problems, out.String())
			}
			for _, want := range tc.wantLines {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
