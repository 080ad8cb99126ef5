package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"
)

// containerdCommon is what every version of the rig's containerd
// configuration starts with: its own root, state and sockets, and no
// snapshotter but overlayfs and native (extra: one more to disable).
func containerdCommon(version int, dir, extra string) string {
	return fmt.Sprintf(`version = %[2]d
root = "%[1]s/root"
state = "%[1]s/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "%[3]s"]

[grpc]
  address = "%[1]s/containerd.sock"
[ttrpc]
  address = "%[1]s/containerd.sock.ttrpc"
[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
`, dir, version, extra)
}

// containerdConfigV3 is a private containerd 2.x: its own root, state,
// sockets, runc (binary and root) and CNI; the CRI plugins pull
// registry.k8s.io and gcr.io from the local registries (certs.d) and never
// from the internet.
func containerdConfigV3(dir, snapshotter, runc string) string {
	return containerdCommon(3, dir, "io.containerd.snapshotter.v1.erofs") + fmt.Sprintf(`
# The transfer service unpacks only for the snapshotter and platform pairs
# listed: the default one and the second runtime handler's.
[plugins."io.containerd.transfer.v1.local"]
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/%[4]s"
    snapshotter = "%[2]s"
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "linux/%[4]s"
    snapshotter = "native"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "%[2]s"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "%[1]s/certs.d"
  # A second runtime handler whose images unpack into another snapshotter:
  # a pull's ImageSpec.runtime_handler shows on disk where it went.
  [plugins."io.containerd.cri.v1.images".runtime_platforms.runc-alt]
    snapshotter = "native"

[plugins."io.containerd.cri.v1.runtime"]
  # These VMs lack CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        Root = "%[1]s/runc"
        BinaryName = "%[3]s"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc-alt]
      runtime_type = "io.containerd.runc.v2"
      snapshotter = "native"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc-alt.options]
        Root = "%[1]s/runc"
        BinaryName = "%[3]s"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["%[1]s/cni/bin"]
    conf_dir = "%[1]s/cni/net.d"
`, dir, snapshotter, runc, goruntime.GOARCH)
}

// containerdConfigV2 is containerdConfigV3 for containerd 1.6.
func containerdConfigV2(dir, snapshotter string) string {
	return containerdCommon(2, dir, "io.containerd.snapshotter.v1.aufs") + fmt.Sprintf(`
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  # These VMs lack CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "%[2]s"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "%[1]s/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[1]s/cni/bin"
    conf_dir = "%[1]s/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "%[1]s/certs.d"
`, dir, snapshotter)
}

// writeHostsToml makes containerd pull name from the plain-HTTP registry
// at 127.0.0.1:port.
func writeHostsToml(certsDir, name string, port int) error {
	return writeMirroredHostsToml(certsDir, name, port, 0)
}

// writeMirroredHostsToml makes containerd pull name from the plain-HTTP
// mirror at 127.0.0.1:mirror (0: none) first, and from its registry at
// 127.0.0.1:server after it (containerd tries each [host] in order, then
// the server).
func writeMirroredHostsToml(certsDir, name string, server, mirror int) error {
	dir := filepath.Join(certsDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c := fmt.Sprintf(`server = "http://127.0.0.1:%[1]d"
`, server)
	if mirror != 0 {
		c += fmt.Sprintf(`
[host."http://127.0.0.1:%[1]d"]
  capabilities = ["pull", "resolve"]
`, mirror)
	}
	c += fmt.Sprintf(`
[host."http://127.0.0.1:%[1]d"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
`, server)
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(c), 0o644)
}

// Two tiny CNI plugins so that pod-network sandboxes start without a real
// network: "loopback" brings lo up in the pod's netns; "rig-fake" reports
// an eth0 with 127.0.0.2 and configures nothing. No traffic leaves.
const cniLoopback = `#!/bin/sh
conf=$(cat); v=$(printf '%s' "$conf" | sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p'); v=${v:-0.3.1}
case "$CNI_COMMAND" in
ADD) nsenter --net="$CNI_NETNS" ip link set lo up || exit 1
     printf '{"cniVersion":"%s","interfaces":[{"name":"lo","sandbox":"%s"}],"ips":[{"version":"4","address":"127.0.0.1/8","interface":0}]}\n' "$v" "$CNI_NETNS" ;;
VERSION) echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.0","0.3.1","0.4.0"]}' ;;
*) exit 0 ;;
esac
`

const cniFake = `#!/bin/sh
conf=$(cat); v=$(printf '%s' "$conf" | sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p'); v=${v:-0.4.0}
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"%s","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"version":"4","address":"127.0.0.2/8","interface":0}]}\n' "$v" "${CNI_IFNAME:-eth0}" "$CNI_NETNS" ;;
VERSION) echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.0","0.3.1","0.4.0"]}' ;;
*) exit 0 ;;
esac
`

func writeCNI(dir string) error {
	for _, d := range []string{"bin", "net.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	files := map[string]struct {
		data string
		mode os.FileMode
	}{
		"bin/loopback":               {cniLoopback, 0o755},
		"bin/rig-fake":               {cniFake, 0o755},
		"net.d/10-rig-fake.conflist": {`{"cniVersion": "0.4.0", "name": "rig-fake", "plugins": [{"type": "rig-fake"}]}`, 0o644},
	}
	for name, f := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(f.data), f.mode); err != nil {
			return err
		}
	}
	return nil
}

// snapshotter returns overlayfs when this machine can mount it, else native.
func snapshotter(scratch string) string {
	t, err := os.MkdirTemp(scratch, "ovl")
	if err != nil {
		return "native"
	}
	defer os.RemoveAll(t)
	for _, d := range []string{"l", "u", "w", "m"} {
		os.Mkdir(filepath.Join(t, d), 0o755)
	}
	opts := fmt.Sprintf("lowerdir=%s/l,upperdir=%s/u,workdir=%s/w", t, t, t)
	if err := syscall.Mount("overlay", filepath.Join(t, "m"), "overlay", 0, opts); err != nil {
		return "native"
	}
	_ = syscall.Unmount(filepath.Join(t, "m"), 0)
	return "overlayfs"
}

// requireCommands says which of the rig's commands are missing.
func requireCommands(names ...string) error {
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %v: run hack/install-deps.sh (as root) first", missing)
	}
	return nil
}
