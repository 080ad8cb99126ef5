package kubeletprobe

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"testing/fstest"
)

func TestEndpoints(t *testing.T) {
	t.Parallel()
	const (
		proxy      = "unix:///run/cri-image-proxy/cri-image-proxy.sock"
		containerd = "unix:///run/containerd/containerd.sock"
	)
	files := fstest.MapFS{
		"var/lib/kubelet/config.yaml":        {Data: []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: " + proxy + "\nfutureField: 1\n")},
		"var/lib/kubelet/no-endpoint.yaml":   {Data: []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")},
		"var/lib/kubelet/image.yaml":         {Data: []byte("kind: KubeletConfiguration\ncontainerRuntimeEndpoint: " + proxy + "\nimageServiceEndpoint: " + containerd + "\n")},
		"etc/kubelet.conf.d/10-first.conf":   {Data: []byte("containerRuntimeEndpoint: unix:///first.sock\n")},
		"etc/kubelet.conf.d/20-second.conf":  {Data: []byte("containerRuntimeEndpoint: " + containerd + "\n")},
		"etc/kubelet.conf.d/30-ignored.yaml": {Data: []byte("containerRuntimeEndpoint: unix:///ignored.sock\n")},
		"var/lib/kubelet/broken.yaml":        {Data: []byte("containerRuntimeEndpoint: [\n")},
	}
	tests := []struct {
		name                 string
		args                 []string
		cwd                  string
		runtime, runtimeFrom string
		image, imageFrom     string
		wantErr              bool
	}{
		{name: "the config file's containerRuntimeEndpoint, the image service following it",
			args: []string{"kubelet", "--config=/var/lib/kubelet/config.yaml"}, runtime: proxy, runtimeFrom: "/var/lib/kubelet/config.yaml containerRuntimeEndpoint", image: proxy, imageFrom: "the runtime endpoint"},
		{name: "a relative --config is resolved against the kubelet's working directory",
			args: []string{"kubelet", "--config", "config.yaml"}, cwd: "/var/lib/kubelet", runtime: proxy, runtimeFrom: "/var/lib/kubelet/config.yaml containerRuntimeEndpoint"},
		{name: "the flag overrides the config file, as the kubelet's flag precedence",
			args: []string{"kubelet", "--config=/var/lib/kubelet/config.yaml", "--container-runtime-endpoint", containerd}, runtime: containerd, runtimeFrom: "flag --container-runtime-endpoint"},
		{name: "drop-ins override the file, in name order, .conf only",
			args: []string{"kubelet", "--config=/var/lib/kubelet/config.yaml", "--config-dir=/etc/kubelet.conf.d"}, runtime: containerd, runtimeFrom: "/etc/kubelet.conf.d/20-second.conf containerRuntimeEndpoint"},
		{name: "nothing set is the kubelet's default, containerd's socket",
			args: []string{"kubelet", "--config=/var/lib/kubelet/no-endpoint.yaml"}, runtime: containerd, runtimeFrom: "the default"},
		{name: "an image service endpoint of its own",
			args: []string{"kubelet", "--config=/var/lib/kubelet/image.yaml"}, runtime: proxy, image: containerd, imageFrom: "/var/lib/kubelet/image.yaml imageServiceEndpoint"},
		{name: "the image service flag overrides the file",
			args: []string{"kubelet", "--config=/var/lib/kubelet/image.yaml", "--image-service-endpoint=" + proxy}, runtime: proxy, image: proxy, imageFrom: "flag --image-service-endpoint"},
		{name: "a config file that does not decode is an error naming it",
			args: []string{"kubelet", "--config=/var/lib/kubelet/broken.yaml"}, wantErr: true},
		{name: "a missing config file is an error",
			args: []string{"kubelet", "--config=/nowhere.yaml"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cwd := tt.cwd
			if cwd == "" {
				cwd = "/"
			}
			p := &Process{Args: tt.args, Root: files, Cwd: cwd}
			e, err := p.Endpoints()
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if e.Runtime.Value != tt.runtime || (tt.runtimeFrom != "" && e.Runtime.From != tt.runtimeFrom) {
				t.Errorf("runtime %+v, want %s from %s", e.Runtime, tt.runtime, tt.runtimeFrom)
			}
			if (tt.image != "" && e.Image.Value != tt.image) || (tt.imageFrom != "" && e.Image.From != tt.imageFrom) {
				t.Errorf("image %+v, want %s from %s", e.Image, tt.image, tt.imageFrom)
			}
		})
	}
}

func TestSocketPath(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"unix:///run/x.sock":   "/run/x.sock",
		"unix:///run//x.sock":  "/run/x.sock",
		"/run/x.sock":          "/run/x.sock",
		"tcp://127.0.0.1:1234": "",
		"npipe:////./pipe/x":   "",
	} {
		if got := SocketPath(in); got != want {
			t.Errorf("SocketPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFindAndOpen reads a process laid out as /proc lays it out.
func TestFindAndOpen(t *testing.T) {
	t.Parallel()
	proc := t.TempDir()
	mk := func(pid int, comm string, args ...string) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		os.MkdirAll(filepath.Join(dir, "root", "etc"), 0o755)
		os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644)
		var cmdline []byte
		for _, a := range args {
			cmdline = append(append(cmdline, a...), 0)
		}
		os.WriteFile(filepath.Join(dir, "cmdline"), cmdline, 0o644)
		os.Symlink("/etc", filepath.Join(dir, "cwd"))
	}
	mk(7, "containerd", "containerd")
	mk(42, "kubelet", "/usr/bin/kubelet", "--config=k.yaml")
	mk(99, "kubelet", "/usr/bin/kubelet")
	os.WriteFile(filepath.Join(proc, "42", "root", "etc", "k.yaml"), []byte("containerRuntimeEndpoint: unix:///p.sock\n"), 0o644)
	os.MkdirAll(filepath.Join(proc, "self"), 0o755)

	pid, err := Find(proc)
	if err != nil || pid != 42 {
		t.Fatalf("Find = %d, %v; want the oldest kubelet, 42", pid, err)
	}
	p, err := Open(proc, pid)
	if err != nil {
		t.Fatal(err)
	}
	e, err := p.Endpoints()
	if err != nil || e.Runtime.Value != "unix:///p.sock" || e.ConfigFile != "/etc/k.yaml" {
		t.Errorf("endpoints %+v, %v: want unix:///p.sock from /etc/k.yaml (relative to its cwd, under its root)", e, err)
	}
	if _, err := Find(t.TempDir()); err != ErrNoKubelet {
		t.Errorf("Find on a node without a kubelet: %v", err)
	}
}

func FuzzParseFlags(f *testing.F) {
	f.Add("kubelet\x00--config\x00/a.yaml\x00--container-runtime-endpoint=unix:///x")
	f.Add("kubelet\x00--config")
	f.Fuzz(func(t *testing.T, cmdline string) {
		parseFlags(splitNUL(cmdline))
	})
}

func splitNUL(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
