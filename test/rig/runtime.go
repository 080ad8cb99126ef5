package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Runtime is the CRI runtime a rig runs. containerd: a 2.x line built by
// hack/build-containerd.sh, 2.3 (the default and the reference: the
// long-term release nodes run) or 2.4 (the newest minor), or Debian's 1.6
// (the legacy leg, for operators still on it). CRI-O: 1.35, built by
// hack/build-crio.sh (RUNTIME=crio), the second runtime Kubernetes nodes
// run.
type Runtime struct {
	// Name is how tables and logs name it: "containerd 2.3.7",
	// "containerd 1.6.20", "cri-o 1.35.2".
	Name string
	// Kind is KindContainerd (or "", the same) or KindCRIO.
	Kind string
	// Line is "2.3", "2.4" or "1.6" for containerd, "1.35" for CRI-O.
	Line string
	// Dir holds containerd, containerd-shim-runc-v2 and runc, or crio,
	// pinns, the runtime wrappers and the CNI plugins (cni/); "" means PATH
	// (Debian's containerd 1.6).
	Dir string
}

// The kinds of Runtime.
const (
	KindContainerd = "containerd"
	KindCRIO       = "crio"
)

// CRIO reports whether the runtime is CRI-O.
func (rt Runtime) CRIO() bool { return rt.Kind == KindCRIO }

// DefaultCRIOVersion is the CRI-O hack/build-crio.sh builds: the module
// proxy serves exact versions only, and this one builds and runs here.
const DefaultCRIOVersion = "v1.35.2"

// crioRuntime is the CRI-O that hack/build-crio.sh built into toolsDir.
func crioRuntime(toolsDir string) (Runtime, error) {
	dir := filepath.Join(toolsDir, "crio-"+DefaultCRIOVersion)
	for _, b := range []string{"crio", "pinns", "runc", "runc.real", "ociclamp", "cni/bridge", "cni/host-local", "cni/loopback"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return Runtime{}, fmt.Errorf("%s not in %s: run hack/install-deps.sh (as root) first", b, dir)
		}
	}
	if err := requireCommands("conmon"); err != nil {
		return Runtime{}, err
	}
	v := strings.TrimPrefix(DefaultCRIOVersion, "v")
	return Runtime{Name: "cri-o " + v, Kind: KindCRIO, Line: versionLine(v), Dir: dir}, nil
}

// DefaultContainerdVersion is the 2.3 patch hack/build-containerd.sh builds
// unless CONTAINERD_VERSION says otherwise.
const DefaultContainerdVersion = "v2.3.7"

// containerdVersions is the patch of each 2.x line that hack/install-deps.sh
// builds (CONTAINERD_VERSIONS there): $CONTAINERD names the line.
var containerdVersions = map[string]string{
	"2.3": DefaultContainerdVersion,
	"2.4": "v2.4.2",
}

// RuntimeFromEnv chooses the runtime from $RUNTIME: "crio" is CRI-O from
// toolsDir; unset or "containerd" is containerd, chosen by $CONTAINERD:
// unset, "2" or "2.3" is containerd 2.3 from toolsDir, "2.4" is containerd
// 2.4 from toolsDir, "1.6" is Debian's. $CONTAINERD_VERSION (v2.3.5, v2.4.0,
// ...) picks another patch hack/build-containerd.sh built; its line must be
// $CONTAINERD's when both are set.
func RuntimeFromEnv(toolsDir string) (Runtime, error) {
	switch os.Getenv("RUNTIME") {
	case "", KindContainerd:
	case KindCRIO:
		// One runtime at a time: a containerd named beside CRI-O would
		// be silently left unused.
		if c, v := os.Getenv("CONTAINERD"), os.Getenv("CONTAINERD_VERSION"); c != "" || v != "" {
			return Runtime{}, fmt.Errorf("RUNTIME=crio with CONTAINERD=%q CONTAINERD_VERSION=%q: name one runtime", c, v)
		}
		return crioRuntime(toolsDir)
	default:
		return Runtime{}, fmt.Errorf("RUNTIME=%q: want containerd (the default) or crio", os.Getenv("RUNTIME"))
	}
	line := os.Getenv("CONTAINERD")
	if line == "1.6" {
		if err := requireCommands("containerd", "runc"); err != nil {
			return Runtime{}, err
		}
		out, _ := exec.Command("containerd", "--version").Output()
		name := "containerd 1.6"
		if f := strings.Fields(string(out)); len(f) >= 3 {
			name = "containerd " + strings.TrimPrefix(f[2], "v")
		}
		return Runtime{Name: name, Kind: KindContainerd, Line: "1.6"}, nil
	}
	if line == "" || line == "2" {
		line = "2.3"
	}
	v, ok := containerdVersions[line]
	if !ok {
		return Runtime{}, fmt.Errorf("CONTAINERD=%q: want 2.3 (the default), 2.4 or 1.6", os.Getenv("CONTAINERD"))
	}
	if pinned := os.Getenv("CONTAINERD_VERSION"); pinned != "" {
		pinnedLine := versionLine(pinned)
		if os.Getenv("CONTAINERD") == "" {
			line = pinnedLine
		} else if pinnedLine != line {
			return Runtime{}, fmt.Errorf("CONTAINERD_VERSION=%q is not of CONTAINERD=%q's line %s", pinned, os.Getenv("CONTAINERD"), line)
		}
		v = pinned
	}
	dir := filepath.Join(toolsDir, "containerd-"+v)
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return Runtime{}, fmt.Errorf("%s not in %s: run hack/install-deps.sh (as root) first", b, dir)
		}
	}
	return Runtime{Name: "containerd " + strings.TrimPrefix(v, "v"), Kind: KindContainerd, Line: line, Dir: dir}, nil
}

// versionLine returns the major.minor of a version such as v2.4.2.
func versionLine(v string) string {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return strings.TrimPrefix(v, "v")
	}
	return parts[0] + "." + parts[1]
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
// its images unpacked by the native snapshotter (NativeSnapshots). CRI-O
// has it too (runc), with no storage of its own.
const AltRuntimeHandler = "runc-alt"

// NativeSnapshots returns how many snapshots containerd's native
// snapshotter holds: where images pulled for AltRuntimeHandler are
// unpacked (0 on CRI-O).
func (r *Rig) NativeSnapshots() int {
	if r.ContainerdSock == "" {
		return 0
	}
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(r.ContainerdSock), "root", "io.containerd.snapshotter.v1.native", "snapshots"))
	return len(entries)
}
