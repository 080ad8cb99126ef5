package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Runtime is the containerd a rig runs: the 2.3 line built by
// hack/build-containerd.sh (the default: what nodes run), or Debian's 1.6
// (the legacy leg, for operators still on it).
type Runtime struct {
	// Name is how tables and logs name it: "containerd 2.3.7", "containerd 1.6.20".
	Name string
	// Line is "2.3" or "1.6".
	Line string
	// Dir holds containerd, containerd-shim-runc-v2 and runc; "" means
	// PATH (Debian's packages).
	Dir string
}

// DefaultContainerdVersion is the 2.3 patch hack/build-containerd.sh builds
// unless CONTAINERD_VERSION says otherwise.
const DefaultContainerdVersion = "v2.3.7"

// RuntimeFromEnv chooses the runtime from $CONTAINERD: unset, "2.3" or "2"
// is containerd 2.3 from toolsDir, "1.6" is Debian's.
func RuntimeFromEnv(toolsDir string) (Runtime, error) {
	switch line := os.Getenv("CONTAINERD"); line {
	case "", "2", "2.3":
		v := os.Getenv("CONTAINERD_VERSION")
		if v == "" {
			v = DefaultContainerdVersion
		}
		dir := filepath.Join(toolsDir, "containerd-"+v)
		for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return Runtime{}, fmt.Errorf("%s not in %s: run hack/install-deps.sh (as root) first", b, dir)
			}
		}
		return Runtime{Name: "containerd " + strings.TrimPrefix(v, "v"), Line: "2.3", Dir: dir}, nil
	case "1.6":
		if err := requireCommands("containerd", "runc"); err != nil {
			return Runtime{}, err
		}
		out, _ := exec.Command("containerd", "--version").Output()
		name := "containerd 1.6"
		if f := strings.Fields(string(out)); len(f) >= 3 {
			name = "containerd " + strings.TrimPrefix(f[2], "v")
		}
		return Runtime{Name: name, Line: "1.6"}, nil
	default:
		return Runtime{}, fmt.Errorf("CONTAINERD=%q: want 2.3 (the default) or 1.6", line)
	}
}

// Legacy reports whether this is the 1.6 line.
func (rt Runtime) Legacy() bool { return rt.Line == "1.6" }

// bin returns the path of one of the runtime's binaries.
func (rt Runtime) bin(name string) string {
	if rt.Dir == "" {
		return name
	}
	return filepath.Join(rt.Dir, name)
}

// env puts the runtime's directory first on PATH, so that containerd
// starts its own shim and the shim its own runc.
func (rt Runtime) env() []string {
	if rt.Dir == "" {
		return nil
	}
	return []string{"PATH=" + rt.Dir + ":" + os.Getenv("PATH")}
}

// config returns containerd's configuration for a private instance in
// dir: version 3 (plugin names io.containerd.cri.v1.*) for 2.x, version 2
// for 1.6.
func (rt Runtime) config(dir, snapshotter string) string {
	if rt.Legacy() {
		return containerdConfigV2(dir, snapshotter)
	}
	return containerdConfigV3(dir, snapshotter, rt.bin("runc"))
}

// AltRuntimeHandler is a second runtime handler of the 2.x rig: runc, with
// its images unpacked by the native snapshotter (NativeSnapshots).
const AltRuntimeHandler = "runc-alt"

// NativeSnapshots returns how many snapshots the native snapshotter holds:
// where images pulled for AltRuntimeHandler are unpacked.
func (r *Rig) NativeSnapshots() int {
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(r.ContainerdSock), "root", "io.containerd.snapshotter.v1.native", "snapshots"))
	return len(entries)
}
