package rig

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The rig's CRI-O lives in <rig>/crio: config, storage, state, logs and
// its socket, nothing in /etc, /var/lib or /run but the containers' attach
// sockets (crioAttachDir), the CNI plugins' result cache
// (/var/lib/cni/results, named after the network) and the pod network's
// bridge (one per rig), all removed at Stop.

// crioAttachDir is where conmon makes each container's attach socket,
// <dir>/<container ID>/attach: under the rig's directory that path is
// longer than a unix socket's 107 bytes and attaching fails ("connect:
// invalid argument"), so it is a short one of the rig's own in /run.
func crioAttachDir(rigDir string) string {
	return filepath.Join("/run", "crio-rig-"+filepath.Base(rigDir))
}

// crioHandlers are the OCI runtime handlers of the rig's CRI-O: runc (the
// default) and AltRuntimeHandler (runc again), so that a test naming the
// containerd rig's second handler finds one here too. Both run the runc of
// the containerd 2.x legs (1.4.3, built by hack/build-crio.sh) through the
// ociclamp wrapper.
// Not crun, CRI-O's upstream default: Debian 12's crun 1.8.1 refuses the
// runtime-spec 1.3 bundles CRI-O 1.35 writes ("unknown version
// specified").
var crioHandlers = []string{"runc", AltRuntimeHandler}

// crioRuntimeBin is the wrapper script every handler runs.
func crioRuntimeBin(dir, _ string) string { return filepath.Join(dir, "runc") }

// crioConfig is CRI-O's configuration for a private instance in dir, with
// the runtimes of toolsDir (Runtime.Dir), storage driver driver and the
// attach sockets in attachDir.
func crioConfig(dir, toolsDir, attachDir, driver, pauseImage string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# The rig's private CRI-O (test/rig/crio.go): everything under %[1]s.
[crio]
root = "%[1]s/storage"
runroot = "%[1]s/run/storage"
storage_driver = "%[3]s"
log_dir = "%[1]s/pods"
version_file = "%[1]s/run/version"
version_file_persist = "%[1]s/version"
clean_shutdown_file = "%[1]s/clean.shutdown"

[crio.api]
listen = "%[1]s/crio.sock"
# Streaming (exec, attach, port-forward) on loopback, any free port.
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
# These VMs run cgroup v1 and no systemd as PID 1.
cgroup_manager = "cgroupfs"
selinux = false
pinns_path = "%[2]s/pinns"
namespaces_dir = "%[1]s/ns"
container_exits_dir = "%[1]s/run/exits"
container_attach_socket_dir = "%[4]s"
hooks_dir = ["%[1]s/hooks.d"]
cdi_spec_dirs = ["%[1]s/cdi"]
irqbalance_config_file = "%[1]s/irqbalance"
irqbalance_config_restore_file = "%[1]s/irqbalance.orig"
decryption_keys_path = "%[1]s/keys"
# Host ports need iptables or nft, which the rig neither has nor should
# touch on a shared machine; containerd's rig has no portmap plugin either.
disable_hostport_mapping = true
`, dir, toolsDir, driver, attachDir)
	for _, h := range crioHandlers {
		fmt.Fprintf(&b, `
[crio.runtime.runtimes.%[1]s]
runtime_path = "%[2]s"
runtime_type = "oci"
runtime_root = "%[3]s/runtimes/%[1]s"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"
`, h, crioRuntimeBin(toolsDir, h), dir)
	}
	fmt.Fprintf(&b, `
[crio.image]
pause_image = "%[3]s"
signature_policy = "%[1]s/policy.json"
signature_policy_dir = "%[1]s/policies"
# Per-namespace credentials CRI-O's credential provider writes: none here.
namespaced_auth_dir = "%[1]s/auth"
# Every image the tests name is fully qualified; containerd resolves no
# short names either.
short_name_mode = "disabled"

[crio.network]
network_dir = "%[1]s/cni/net.d"
plugin_dirs = ["%[2]s/cni"]

[crio.metrics]
enable_metrics = false

# NRI's socket is machine-wide (/var/run/nri): off, so rigs do not meet there.
[crio.nri]
enable_nri = false
`, dir, toolsDir, pauseImage)
	return b.String()
}

// route is where the rig's CRI-O pulls a registry name from: the
// plain-HTTP registry on 127.0.0.1:location, after the mirror on
// 127.0.0.1:mirror when there is one (not 0).
type route struct{ location, mirror int }

// registriesConf is containers-registries.conf(5) (version 2) for the rig's
// CRI-O: each name is pulled from the plain-HTTP registry on
// 127.0.0.1:port and from nowhere else, as the containerd rig's hosts.toml
// files say. A name's location is rewritten (a mirror alone would fall
// back to the name's own host on the internet); a route's mirror is tried
// before that location, as containerd tries a [host] before the server.
//
// insecure makes containers/image try HTTPS first, then HTTP: the
// registry must answer a TLS hello with an HTTP status line, which the Go
// servers here (the distribution registry, the tests' registries and
// relays) do.
func registriesConf(routes map[string]route) string {
	var b strings.Builder
	b.WriteString("# The rig's CRI-O registries (test/rig/crio.go): every name to a plain-HTTP registry on 127.0.0.1.\nunqualified-search-registries = []\nshort-name-mode = \"disabled\"\n")
	keys := make([]string, 0, len(routes))
	for n := range routes {
		keys = append(keys, n)
	}
	sort.Strings(keys)
	for _, n := range keys {
		fmt.Fprintf(&b, "\n[[registry]]\nprefix = %q\nlocation = \"127.0.0.1:%d\"\ninsecure = true\n", n, routes[n].location)
		if m := routes[n].mirror; m != 0 {
			fmt.Fprintf(&b, "\n[[registry.mirror]]\nlocation = \"127.0.0.1:%d\"\ninsecure = true\n", m)
		}
	}
	return b.String()
}

// crioPolicy accepts every image: the signature policy is the proxy's or
// the test's business, not the rig's.
const crioPolicy = `{"default": [{"type": "insecureAcceptAnything"}]}` + "\n"

// crioNetwork is the pod network: a bridge of the rig's own with a /24 of
// its own, no masquerading and no default route in the pods, so a pod
// reaches the bridge's subnet (the host and the rig's other pods) and
// nothing else.
func crioNetwork(bridge, subnet, ipamDir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %[1]q,
  "plugins": [{
    "type": "bridge",
    "bridge": %[1]q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %[3]q, "ranges": [[{"subnet": %[2]q}]]}
  }]
}
`, bridge, subnet, ipamDir)
}

// claimBridge creates a bridge for the rig's pod network, rig-crio-<n>
// with 10.89.<n>.0/24, n the first free: creating the link is atomic, so
// two rigs starting at once never share one, and a /24 an interface of
// the machine already has is skipped.
func claimBridge() (name, subnet string, err error) {
	used := map[string]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil {
			used[ip.IP.Mask(net.CIDRMask(24, 32)).String()] = true
		}
	}
	for n := range 256 {
		subnet := fmt.Sprintf("10.89.%d.0/24", n)
		if used[fmt.Sprintf("10.89.%d.0", n)] {
			continue
		}
		name := fmt.Sprintf("rig-crio-%d", n)
		if out, err := exec.Command("ip", "link", "add", "name", name, "type", "bridge").CombinedOutput(); err != nil {
			if strings.Contains(string(out), "exists") {
				continue
			}
			return "", "", fmt.Errorf("ip link add %s: %v: %s", name, err, out)
		}
		return name, subnet, nil
	}
	return "", "", errors.New("no free rig-crio-N bridge for the pod network")
}

// setupCRIO writes the rig's CRI-O configuration under dir/crio.
func (r *Rig) setupCRIO(regPort, anonPort, gcrPort int) error {
	dir := r.crioDir()
	for _, d := range []string{"conf.d", "registries.d", "cni/net.d", "cni/ipam", "home", "xdg-run", "hooks.d", "cdi", "policies", "pods", "ns"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	// containerd speaks plain HTTP to any registry on 127.0.0.1 by itself;
	// containers/image only to those registries.conf calls insecure, so
	// the anonymous view is named too (tests pull from it by address), and
	// a test's own registry needs AddMirror.
	r.mirrors = map[string]route{
		r.Registry:          {location: regPort},
		r.AnonRegistry:      {location: anonPort},
		"registry.rig.test": {location: regPort}, // the authenticated registry under a DNS-like name
		"gcr.io":            {location: gcrPort}, // critest's images
		"registry.k8s.io":   {location: anonPort},
	}
	if err := r.writeRegistriesConf(); err != nil {
		return err
	}
	bridge, subnet, err := claimBridge()
	if err != nil {
		return err
	}
	if _, r.podSubnet, err = net.ParseCIDR(subnet); err != nil {
		return err
	}
	// Stop and a later rig's reapStale delete the bridge by this name.
	if err := os.WriteFile(filepath.Join(dir, "bridge"), []byte(bridge), 0o644); err != nil {
		return err
	}
	driver := "overlay"
	if r.Snapshotter == "native" {
		driver = "vfs"
	}
	files := map[string]string{
		"crio.conf":                 crioConfig(dir, r.Runtime.Dir, crioAttachDir(r.Dir), driver, "registry.k8s.io/pause:3.9"),
		"policy.json":               crioPolicy,
		"cni/net.d/10-rig.conflist": crioNetwork(bridge, subnet, filepath.Join(dir, "cni", "ipam")),
		// containers/storage reads storage.conf for its defaults even when
		// CRI-O names root, runroot and driver: a private one keeps the
		// machine's (if any) out.
		"storage.conf": fmt.Sprintf("[storage]\ndriver = %q\nrunroot = %q\ngraphroot = %q\n", driver, filepath.Join(dir, "run", "storage"), filepath.Join(dir, "storage")),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (r *Rig) crioDir() string { return filepath.Join(r.Dir, "crio") }

// writeRegistriesConf writes r.mirrors as CRI-O's registries.conf, and
// as hosts.toml files for the proxy's registry check (proxyHostsDir).
func (r *Rig) writeRegistriesConf() error {
	path := r.RegistriesConf()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(registriesConf(r.mirrors)), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Names that stay are rewritten in place and only the dropped ones
	// removed: a check running meanwhile never finds a name missing.
	hosts := r.proxyHostsDir()
	for name, rt := range r.mirrors {
		if err := writeMirroredHostsToml(hosts, name, rt.location, rt.mirror); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(hosts)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, ok := r.mirrors[e.Name()]; !ok {
			if err := os.RemoveAll(filepath.Join(hosts, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// proxyHostsDir is, on CRI-O, registries.conf again as hosts.toml files,
// for the proxy's registry check (ProxyRegistryFlags): the proxy reads no
// registries.conf, and without these files its check would ask each
// image's own registry by its name (gcr.io, registry.k8s.io: the internet)
// instead of the local registry CRI-O pulls it from. A route's mirror is
// a [host] before the server, as in containerd's files: the check asks
// the server, the registry itself, not a mirror it was not told to vouch
// for.
func (r *Rig) proxyHostsDir() string { return filepath.Join(r.crioDir(), "proxy-certs.d") }

// crioEnv is CRI-O's environment on top of the test's: no login of the
// machine's or the test's may reach it. containers/image reads
// DOCKER_CONFIG, REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json
// and ~/.docker/config.json as node-wide credentials; empty variables count
// as unset, and HOME and the XDG directories are the rig's.
func (r *Rig) crioEnv() []string {
	dir := r.crioDir()
	return []string{
		"DOCKER_CONFIG=", "REGISTRY_AUTH_FILE=",
		"HOME=" + filepath.Join(dir, "home"),
		"XDG_RUNTIME_DIR=" + filepath.Join(dir, "xdg-run"),
		"XDG_CONFIG_HOME=" + filepath.Join(dir, "home", ".config"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + r.RegistriesConf(),
	}
}

// startCRIO starts the rig's CRI-O.
func (r *Rig) startCRIO() (*Proc, error) {
	dir := r.crioDir()
	return StartProc("crio", filepath.Join(dir, "crio.log"), r.crioEnv(),
		filepath.Join(r.Runtime.Dir, "crio"), "--config", filepath.Join(dir, "crio.conf"),
		"--config-dir", filepath.Join(dir, "conf.d"),
		"--registries-conf", r.RegistriesConf(), "--registries-conf-dir", filepath.Join(dir, "registries.d"),
		"--log-level", "info")
}

// registryReloads counts CRI-O's log lines saying it read registries.conf
// again.
func registryReloads(p *Proc) int {
	return strings.Count(p.LogText(), "Applied new registry configuration")
}

// reloadCRIO makes a running CRI-O read registries.conf again: CRI-O (its
// containers/image) reads the file once and keeps it, and rereads it on
// SIGHUP only. It returns once CRI-O's log says the new file applies.
func (r *Rig) reloadCRIO() error {
	p := r.runtime
	if p == nil || !p.Alive() {
		return nil // the next start reads the file
	}
	before := registryReloads(p)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		return err
	}
	return WaitFor("CRI-O's reload of registries.conf", p, 30*time.Second, func() error {
		if registryReloads(p) > before {
			return nil
		}
		return errors.New("no \"Applied new registry configuration\" in its log yet")
	})
}

// cleanupCRIO ends what a CRI-O in dir (<rig>/crio) left behind, whether it
// still runs or not: every container its runtimes know (delete --force
// kills the container's processes, which conmon does not own as a shim
// owns them), the conmon processes (their command lines name dir), the
// pod network's bridge and CNI result files.
func cleanupCRIO(dir, toolsDir string) {
	for _, h := range crioHandlers {
		root := filepath.Join(dir, "runtimes", h)
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_ = exec.CommandContext(ctx, crioRuntimeBin(toolsDir, h), "--root", root, "delete", "--force", e.Name()).Run()
			cancel()
		}
	}
	killByCwdOrArgs(dir)
	os.RemoveAll(crioAttachDir(filepath.Dir(dir)))
	if b, err := os.ReadFile(filepath.Join(dir, "bridge")); err == nil && len(b) > 0 {
		bridge := strings.TrimSpace(string(b))
		_ = exec.Command("ip", "link", "del", bridge).Run()
		// libcni keeps each attachment's result as <network>-<id>-<ifname>
		// in /var/lib/cni/results, whoever's CNI it was.
		results, _ := filepath.Glob("/var/lib/cni/results/" + bridge + "-*")
		for _, f := range results {
			os.Remove(f)
		}
	}
}

// crioToolsDir is the tools directory of a CRI-O rig from its config: a
// stale rig's, whose Runtime is not known any more.
func crioToolsDir(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "crio.conf"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "pinns_path = "); ok {
			if p, err := strconv.Unquote(v); err == nil {
				return filepath.Dir(p)
			}
		}
	}
	return ""
}
