package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// proxyImage is the proxy's OCI image, built by hack/image from a static
// binary and pushed to the rig's registry once per test binary.
var proxyImage struct {
	once sync.Once
	ref  string // through the anonymous registry, as a public image
	err  error
}

// buildProxyImage builds the image as `make image` does, for this
// machine's architecture only, and pushes it with the rig's credentials.
func buildProxyImage() (string, error) {
	proxyImage.once.Do(func() {
		dir, err := os.MkdirTemp(testRig.Dir, "image")
		if err != nil {
			proxyImage.err = err
			return
		}
		bin := filepath.Join(dir, "cri-image-proxy-linux-"+runtime.GOARCH)
		build := exec.Command("go", "build", "-trimpath", "-o", bin, "../../cmd/cri-image-proxy")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			proxyImage.err = fmt.Errorf("static build: %v: %s", err, out)
			return
		}
		auth, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": "user", "password": rig.Users["user"]}}})
		if err := os.WriteFile(filepath.Join(dir, "config.json"), auth, 0o600); err != nil {
			proxyImage.err = err
			return
		}
		const repo = "cri-image-proxy:e2e"
		img := exec.Command("go", "run", "../../hack/image", "-bin-dir", dir, "-platforms", "linux/"+runtime.GOARCH,
			"-version", "e2e", "-push", testRig.Registry+"/"+repo)
		img.Env = append(os.Environ(), "DOCKER_CONFIG="+dir)
		if out, err := img.CombinedOutput(); err != nil {
			proxyImage.err = fmt.Errorf("hack/image: %v: %s", err, out)
			return
		}
		proxyImage.ref = testRig.AnonRegistry + "/" + repo
	})
	return proxyImage.ref, proxyImage.err
}

// dsHost is where, on this node, the DaemonSet's hostPath volumes point:
// the manifest's paths are the usual ones (/run/containerd, the kubelet's
// kubeconfig...), the rig's live under its directory.
type dsHost struct {
	dir, socketDir, stateDir, pluginDir, providerConfig, pki string
}

var daemonSetScenario = nodeScenario{
	name:   "the DaemonSet, from the proxy's own container image: Ready under the kubelet; serves its host socket, plugin and records; gone with its pod",
	needs:  []nodeNeed{containerdRuntime},
	images: []string{"byplugin/daemonset:v1"},
	run:    (*nodeEnv).scenarioDaemonSet,
}

// scenarioDaemonSet: deploy/kubernetes/daemonset.yaml for real. The
// manifest is applied as written but for the image (the one hack/image
// built), its host paths (the rig's) and its monitoring port (the node's
// own proxy holds 9741's place); the pod the DaemonSet controller would
// make from its template (the rig has no controller manager) starts under
// the kubelet, through the node's proxy, and becomes Ready by the proxy's
// /readyz. The proxy inside it serves its host socket: containerd's
// answers, a plugin's credentials injected (a static plugin mounted from
// the host), its records on the host. Deleted, it stops and removes its
// socket.
func (e *nodeEnv) scenarioDaemonSet(t *testing.T) {
	image, err := buildProxyImage()
	if err != nil {
		t.Fatal(err)
	}
	cm, ds := readDaemonSetManifest(t)
	h := e.daemonSetHost(t)
	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")

	// The ConfigMap as written, on another monitoring port.
	cfg := cm.Data["config.yaml"]
	if !strings.Contains(cfg, "address: 127.0.0.1:9741") {
		t.Fatalf("the manifest's config no longer sets the monitoring address 127.0.0.1:9741:\n%s", cfg)
	}
	cm.Data["config.yaml"] = strings.Replace(cfg, "127.0.0.1:9741", "127.0.0.1:"+port, 1)

	hostPaths := map[string]string{
		"socket-dir":         h.socketDir,
		"state":              h.stateDir,
		"containerd":         filepath.Dir(testRig.ContainerdSock),
		"provider-config":    h.providerConfig,
		"provider-bin":       h.pluginDir,
		"kubelet-kubeconfig": e.kubeconfig,
		"kubelet-pki":        h.pki,
	}
	for i := range ds.Spec.Template.Spec.Volumes {
		v := &ds.Spec.Template.Spec.Volumes[i]
		if v.HostPath == nil {
			continue
		}
		p, ok := hostPaths[v.Name]
		if !ok {
			t.Fatalf("the manifest has a host path volume %q this test does not know", v.Name)
		}
		v.HostPath.Path = p
		delete(hostPaths, v.Name)
	}
	if len(hostPaths) != 0 {
		t.Fatalf("the manifest lost host path volumes: %v", hostPaths)
	}
	c := &ds.Spec.Template.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = image, corev1.PullIfNotPresent
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		probe.HTTPGet.Port = intstr.Parse(port)
	}

	ctx := context.Background()
	ns := ds.Namespace
	cm.Name = "cri-image-proxy-" + e.v.id
	ds.Name = cm.Name
	for i := range ds.Spec.Template.Spec.Volumes {
		if cmv := ds.Spec.Template.Spec.Volumes[i].ConfigMap; cmv != nil {
			cmv.Name = cm.Name
		}
	}
	admin := e.k.Admin
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err) // the rig has no controller manager to make it
	}
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created, err := admin.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil {
		t.Fatal(err)
	}
	// The pod the DaemonSet controller would make: the template, bound to
	// this node, owned by the DaemonSet.
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ds.Name + "-" + "node", Labels: ds.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: created.Name, UID: created.UID, Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = kuberig.NodeName
	pod, err = admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		admin.AppsV1().DaemonSets(ns).Delete(ctx, ds.Name, metav1.DeleteOptions{})
		admin.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{})
	})
	e.waitFor(t, pod, "Ready", 3*time.Minute, func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	})

	sock := "unix://" + filepath.Join(h.socketDir, "cri-image-proxy.sock")
	ctxTimeout, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	direct, viaPod := testRig.Crictl(ctxTimeout, "unix://"+testRig.RuntimeSock, "version"), testRig.Crictl(ctxTimeout, sock, "version")
	if viaPod.Err != nil || viaPod.Stdout != direct.Stdout {
		t.Fatalf("crictl version through the pod's socket: %v %s, want containerd's answer:\n%s", viaPod.Err, viaPod.Stderr, direct.Stdout)
	}
	// The plugin runs inside the pod, from the host's plugin directory: an
	// image only the node's credentials can pull, new to the registry's log.
	byPlugin := e.image("byplugin/daemonset:v1")
	if res := testRig.Crictl(ctxTimeout, sock, "pull", byPlugin); res.Err != nil {
		t.Fatalf("a pull without credentials through the pod's proxy: %v: %s", res.Err, res.Stderr)
	}
	if _, m := httpGet(t, "127.0.0.1:"+port, "/metrics"); !strings.Contains(m, `cri_image_proxy_credential_injection_pulls_total{result="injected"} 1`) {
		t.Errorf("the pod's proxy did not count one injected pull; its metrics:\n%s", m)
	}
	out, err := exec.Command(proxyBin, "records", "list", "--admin-socket", filepath.Join(h.socketDir, "admin.sock")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), strings.TrimSuffix(byPlugin, ":v1")) {
		t.Errorf("records list over the pod's admin socket: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(h.stateDir, "ensure.db")); err != nil {
		t.Errorf("the records are not on the host: %v", err)
	}

	// Deleted with its grace period, the proxy stops and takes its socket.
	if err := admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitGone(t, pod)
	if _, err := os.Stat(filepath.Join(h.socketDir, "cri-image-proxy.sock")); !os.IsNotExist(err) {
		t.Errorf("the pod's socket outlived it (%v)", err)
	}
}

// readDaemonSetManifest reads deploy/kubernetes/daemonset.yaml: a
// ConfigMap and a DaemonSet.
func readDaemonSetManifest(t *testing.T) (*corev1.ConfigMap, *appsv1.DaemonSet) {
	t.Helper()
	data, err := os.ReadFile("../../deploy/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	var ds appsv1.DaemonSet
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ConfigMap":
			err = yaml.UnmarshalStrict(doc, &cm)
		case "DaemonSet":
			err = yaml.UnmarshalStrict(doc, &ds)
		default:
			t.Fatalf("daemonset.yaml: unexpected kind %q", meta.Kind)
		}
		if err != nil {
			t.Fatalf("daemonset.yaml, the %s: %v", meta.Kind, err)
		}
	}
	if cm.Name == "" || ds.Name == "" || len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("daemonset.yaml: want a ConfigMap and a DaemonSet of one container")
	}
	return &cm, &ds
}

// daemonSetHost makes the pod's host side: its socket and state
// directories, and the reference plugin built static (it runs inside the
// image, which has no C library) with the node's credentials, under the
// paths the manifest's config names inside the pod.
func (e *nodeEnv) daemonSetHost(t *testing.T) dsHost {
	t.Helper()
	dir, err := os.MkdirTemp(testRig.Dir, "ds")
	if err != nil {
		t.Fatal(err)
	}
	h := dsHost{dir: dir, socketDir: filepath.Join(dir, "run"), stateDir: filepath.Join(dir, "state"), pluginDir: filepath.Join(dir, "exec"),
		providerConfig: filepath.Join(dir, "credential-providers.yaml"), pki: filepath.Join(dir, "pki")}
	for _, d := range []string{h.socketDir, h.stateDir, h.pluginDir, h.pki} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const inPod = "/usr/libexec/kubernetes/kubelet-plugins/credential-provider/exec"
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(h.pluginDir, "node-creds"), "../../cmd/docker-config-credential-provider")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static plugin: %v: %s", err, out)
	}
	auth, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": "user", "password": rig.Users["user"]}}})
	if err := os.WriteFile(filepath.Join(h.pluginDir, "config.json"), auth, 0o600); err != nil {
		t.Fatal(err)
	}
	providers := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: node-creds
    matchImages: ["%s/node-%s/byplugin"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--docker-config", "%s/config.json"]
`, testRig.Registry, e.v.id, inPod)
	if err := os.WriteFile(h.providerConfig, []byte(providers), 0o644); err != nil {
		t.Fatal(err)
	}
	return h
}
