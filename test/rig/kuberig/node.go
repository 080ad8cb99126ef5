package kuberig

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"
)

// NodeName is the name the rig's kubelet registers. It resolves to
// 127.0.0.1, so the apiserver reaches the kubelet on loopback for logs and
// exec; the kubelet refuses a loopback --node-ip, not a loopback name.
const NodeName = "127.0.0.1"

// NodeUser is the node's identity: a static token of system:node:NAME in
// system:nodes, so the Node authorizer and NodeRestriction apply to it.
const NodeUser = "system:node:" + NodeName

// OldKubeVersion is the old kubelet hack/build-k8s.sh --module k8s-old
// builds: before KEP-2535 and KEP-4412.
const OldKubeVersion = "v1.31.4"

// KubeletBin returns the kubelet hack/build-k8s.sh built for version.
func KubeletBin(r *rig.Rig, version string) string {
	return filepath.Join(r.ToolsDir, "k8s-"+version, "kubelet")
}

// KubeletOptions configure a kubelet.
type KubeletOptions struct {
	// Bin is the kubelet binary.
	Bin string
	// CRIEndpoint is its runtime and image endpoint (unix:///path): the
	// proxy's socket.
	CRIEndpoint string
	// FeatureGates are set in its configuration, when any.
	FeatureGates map[string]bool
	// VerificationPolicy is its imagePullCredentialsVerificationPolicy
	// (1.33+), when set.
	VerificationPolicy string
	// ExtraArgs are added to its command line: e.g. its own credential
	// provider plugins (--image-credential-provider-config, -bin-dir), for
	// a kubelet on the runtime directly to run what the proxy would.
	ExtraArgs []string
	// Config overrides fields of its KubeletConfiguration (e.g.
	// registryPullQPS).
	Config map[string]any
}

// Node is a real kubelet registered with the rig's apiserver, with the
// rig's containerd behind CRIEndpoint. One runs at a time on a machine:
// the kubelet writes a few host paths and sysctls whatever its root dir.
type Node struct {
	Name    string
	Dir     string
	Version string // the kubelet's, e.g. v1.31.4

	kube     *Kube
	opts     KubeletOptions
	cfgPath  string
	argv     []string
	kubelet  *rig.Proc
	sysctls  map[string]string // their values before the kubelet
	restarts int
}

// kubeletSysctls are the sysctls the kubelet sets (setupKernelTunables);
// Stop puts the machine's values back.
var kubeletSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// StartNode starts a kubelet in a directory of r with the node's
// credentials and waits until its Node is Ready.
func StartNode(r *rig.Rig, k *Kube, opts KubeletOptions) (n *Node, err error) {
	if _, err := os.Stat(opts.Bin); err != nil {
		return nil, fmt.Errorf("kubelet %s: %w: run hack/build-k8s.sh (hack/install-deps.sh does)", opts.Bin, err)
	}
	out, err := exec.Command(opts.Bin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %w", opts.Bin, err)
	}
	dir, err := os.MkdirTemp(r.Dir, "node")
	if err != nil {
		return nil, err
	}
	n = &Node{Name: NodeName, Dir: dir, kube: k, Version: strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes "),
		sysctls: map[string]string{}}
	for _, s := range kubeletSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			n.sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	kubeconfig, err := k.WriteKubeconfig(NodeUser)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(n.StaticPodPath(), 0o755); err != nil {
		return nil, err
	}
	cfg, err := n.kubeletConfig(opts)
	if err != nil {
		return nil, err
	}
	n.opts, n.cfgPath = opts, filepath.Join(dir, "kubelet-config.yaml")
	cfgPath := n.cfgPath
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	n.argv = []string{opts.Bin, "--config=" + cfgPath, "--kubeconfig=" + kubeconfig,
		"--root-dir=" + filepath.Join(dir, "root"), "--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + NodeName, "--v=2"}
	// The kubelet refuses a loopback node IP; a host address is only
	// reported in the Node's status, nothing listens on it.
	if ip := hostIPv4(); ip != "" {
		n.argv = append(n.argv, "--node-ip="+ip)
	}
	n.argv = append(n.argv, opts.ExtraArgs...)
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) start() error {
	n.restarts++
	p, err := rig.StartProc("kubelet", filepath.Join(n.Dir, fmt.Sprintf("kubelet-%d.log", n.restarts)), nil, n.argv...)
	if err != nil {
		return err
	}
	n.kubelet = p
	return rig.WaitFor("kubelet", p, 90*time.Second, func() error { return n.ready(context.Background()) })
}

// Restart restarts the kubelet with the same flags and state: its pods go
// on running.
func (n *Node) Restart() error {
	n.Pause()
	return n.Resume("")
}

// Pause stops the kubelet process alone: its pods go on running, its
// state stays, and the Node is left as it is until Resume.
func (n *Node) Pause() { n.kubelet.Stop(30 * time.Second) }

// Resume starts the paused kubelet again, on endpoint as its runtime and
// image endpoint unless endpoint is "", and waits until its Node is Ready.
func (n *Node) Resume(endpoint string) error {
	if endpoint != "" {
		n.opts.CRIEndpoint = endpoint
		cfg, err := n.kubeletConfig(n.opts)
		if err != nil {
			return err
		}
		if err := os.WriteFile(n.cfgPath, cfg, 0o644); err != nil {
			return err
		}
	}
	return n.start()
}

// StaticPodPath is the kubelet's staticPodPath: a pod manifest written
// there runs as a static pod.
func (n *Node) StaticPodPath() string { return filepath.Join(n.Dir, "manifests") }

// RootDir is the kubelet's --root-dir (its KEP-2535 records are under
// image_manager).
func (n *Node) RootDir() string { return filepath.Join(n.Dir, "root") }

// ready is nil when the Node's Ready condition is True.
func (n *Node) ready(ctx context.Context) error {
	node, err := n.kube.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("node %s not Ready yet", n.Name)
}

// Log returns the kubelet's log since its last start.
func (n *Node) Log() string { return n.kubelet.LogText() }

// Pid is the running kubelet's process ID.
func (n *Node) Pid() int { return n.kubelet.Pid() }

func (n *Node) kubeletConfig(opts KubeletOptions) ([]byte, error) {
	port, err := rig.FreePort()
	if err != nil {
		return nil, err
	}
	healthz, err := rig.FreePort()
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{
		"apiVersion":         "kubelet.config.k8s.io/v1beta1",
		"kind":               "KubeletConfiguration",
		"address":            "127.0.0.1",
		"port":               port,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        healthz,
		// The apiserver reaches the kubelet (logs, exec) without a client
		// certificate: anonymous, on loopback only.
		"authentication":           map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":            map[string]any{"mode": "AlwaysAllow"},
		"containerRuntimeEndpoint": opts.CRIEndpoint,
		"imageServiceEndpoint":     opts.CRIEndpoint,
		// This machine: cgroup v1 with cgroupfs, no QoS cgroups, swap on.
		"cgroupDriver":           "cgroupfs",
		"cgroupsPerQOS":          false,
		"enforceNodeAllocatable": []string{},
		"failSwapOn":             false,
		"failCgroupV1":           false,
		"podLogsDir":             filepath.Join(n.Dir, "pod-logs"),
		"volumePluginDir":        filepath.Join(n.Dir, "volume-plugins"),
		// The kubelet must not collect the tests' images or evict on a
		// small disk.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard":                map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"clusterDomain":               "cluster.local",
		"resolvConf":                  "/etc/resolv.conf",
		"syncFrequency":               "5s",
		"fileCheckFrequency":          "10s",
		"nodeStatusUpdateFrequency":   "10s",
		"serializeImagePulls":         false,
		// Static pods: manifest files the kubelet runs with no API object
		// (a mirror pod shows their status).
		"staticPodPath": n.StaticPodPath(),
	}
	if len(opts.FeatureGates) > 0 {
		cfg["featureGates"] = opts.FeatureGates
	}
	maps.Copy(cfg, opts.Config)
	if opts.VerificationPolicy != "" {
		cfg["imagePullCredentialsVerificationPolicy"] = opts.VerificationPolicy
	}
	return yaml.Marshal(cfg)
}

// Stop stops the kubelet, removes the sandboxes it left in containerd and
// its Node, and puts back what it changed on the host.
func (n *Node) Stop() {
	if n.kubelet != nil {
		n.kubelet.Stop(30 * time.Second)
	}
	for s, v := range n.sysctls {
		_ = os.WriteFile("/proc/sys/"+s, []byte(v), 0o644)
	}
	// Its container log links outside its root dir.
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if t, err := os.Readlink(l); err == nil && strings.HasPrefix(t, n.Dir+"/") {
			os.Remove(l)
		}
	}
	if n.kube != nil {
		err := n.kube.Admin.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "rig: delete node %s: %v\n", n.Name, err)
		}
	}
	_ = rig.UnmountUnder(n.Dir)
}

// RemoveKubeletPods stops and removes the pod sandboxes a kubelet made
// (they carry io.kubernetes.pod.uid), leaving crictl's alone.
func RemoveKubeletPods(ctx context.Context, r *rig.Rig) error {
	return r.CRICall(ctx, func(rt runtimeapi.RuntimeServiceClient) error {
		pods, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if _, ok := p.Labels["io.kubernetes.pod.uid"]; !ok {
				continue
			}
			if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
				return err
			}
			if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
				return err
			}
		}
		return nil
	})
}

// hostIPv4 is the first global unicast IPv4 address of the host, "" when
// it has none.
func hostIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	return ""
}

// CreateNamespace creates a namespace with what the controller-manager
// would add to it: the ServiceAccount "default" and the ConfigMap
// kube-root-ca.crt that service-account token volumes mount.
func (k *Kube) CreateNamespace(ctx context.Context, name string) error {
	if _, err := k.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := k.Admin.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := k.Admin.CoreV1().ConfigMaps(name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data: map[string]string{"ca.crt": string(k.CA)}}, metav1.CreateOptions{})
	return err
}

// PulledRecords returns the kubelet's own KEP-2535 records (files under
// its root dir's image_manager/pulled), when its feature is on.
func (n *Node) PulledRecords() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(n.Dir, "root", "image_manager", "pulled", "*", "*"))
	if err != nil {
		return nil, err
	}
	more, _ := filepath.Glob(filepath.Join(n.Dir, "root", "image_manager", "pulled", "*"))
	var out []string
	for _, f := range append(files, more...) {
		if b, err := os.ReadFile(f); err == nil {
			out = append(out, string(b))
		}
	}
	return out, nil
}
