package rig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuntimeFromEnvChoosesTheBuiltLineAndPatch(t *testing.T) {
	t.Setenv("RUNTIME", "")
	tools := t.TempDir()
	for _, v := range []string{"v2.3.7", "v2.4.2", "v2.4.0"} {
		dir := filepath.Join(tools, "containerd-"+v)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
			if err := os.WriteFile(filepath.Join(dir, b), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name, containerd, version string
		wantName, wantLine        string
		wantErr                   string
	}{
		{name: "unset is the reference, 2.3", wantName: "containerd 2.3.7", wantLine: "2.3"},
		{name: "2 is 2.3", containerd: "2", wantName: "containerd 2.3.7", wantLine: "2.3"},
		{name: "2.3 by name", containerd: "2.3", wantName: "containerd 2.3.7", wantLine: "2.3"},
		{name: "2.4 is the newest minor", containerd: "2.4", wantName: "containerd 2.4.2", wantLine: "2.4"},
		{name: "a pinned patch alone names its line", version: "v2.4.0", wantName: "containerd 2.4.0", wantLine: "2.4"},
		{name: "a pinned patch of the chosen line", containerd: "2.4", version: "v2.4.0", wantName: "containerd 2.4.0", wantLine: "2.4"},
		{name: "a pinned patch of another line is refused", containerd: "2.3", version: "v2.4.0", wantErr: `CONTAINERD_VERSION="v2.4.0" is not of CONTAINERD="2.3"'s line 2.3`},
		{name: "a line nothing builds is refused", containerd: "2.5", wantErr: `CONTAINERD="2.5": want 2.3 (the default), 2.4 or 1.6`},
		{name: "a patch not built says how to build it", version: "v2.3.6", wantErr: "run hack/install-deps.sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CONTAINERD", tt.containerd)
			t.Setenv("CONTAINERD_VERSION", tt.version)
			rt, err := RuntimeFromEnv(tools)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rt.Name != tt.wantName || rt.Line != tt.wantLine || rt.Legacy() {
				t.Errorf("got %+v, want %s of line %s", rt, tt.wantName, tt.wantLine)
			}
			if want := filepath.Join(tools, "containerd-v"+strings.TrimPrefix(tt.wantName, "containerd ")); rt.Dir != want {
				t.Errorf("Dir = %s, want %s", rt.Dir, want)
			}
		})
	}
}

func TestRuntimeFromEnvRuntimeCRIO(t *testing.T) {
	tools := t.TempDir()
	dir := filepath.Join(tools, "crio-"+DefaultCRIOVersion)
	t.Setenv("CONTAINERD", "")
	t.Setenv("CONTAINERD_VERSION", "")

	t.Setenv("RUNTIME", "crio")
	if _, err := RuntimeFromEnv(tools); err == nil || !strings.Contains(err.Error(), "run hack/install-deps.sh") {
		t.Fatalf("with nothing built: err = %v, want one saying how to build it", err)
	}
	for _, b := range []string{"crio", "pinns", "runc", "runc.real", "ociclamp", "cni/bridge", "cni/host-local", "cni/loopback"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, b)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, b), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rt, err := RuntimeFromEnv(tools)
	if err != nil {
		if strings.Contains(err.Error(), "missing") {
			t.Skipf("conmon not installed here: %v", err)
		}
		t.Fatal(err)
	}
	if !rt.CRIO() || rt.Name != "cri-o 1.35.2" || rt.Line != "1.35" || rt.Dir != dir || rt.Legacy() {
		t.Errorf("got %+v, want cri-o 1.35.2 from %s", rt, dir)
	}

	t.Setenv("CONTAINERD", "2.4")
	if _, err := RuntimeFromEnv(tools); err == nil || !strings.Contains(err.Error(), "name one runtime") {
		t.Errorf("RUNTIME=crio with CONTAINERD=2.4: err = %v, want a refusal", err)
	}
	t.Setenv("CONTAINERD", "")
	t.Setenv("RUNTIME", "docker")
	if _, err := RuntimeFromEnv(tools); err == nil || !strings.Contains(err.Error(), "want containerd (the default) or crio") {
		t.Errorf("RUNTIME=docker: err = %v, want a refusal", err)
	}
}
