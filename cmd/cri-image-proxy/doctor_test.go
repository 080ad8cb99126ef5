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
