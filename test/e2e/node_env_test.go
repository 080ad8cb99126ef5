package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// nodeEnv is one kubelet variant's node: the proxy in front of
// containerd, the kubelet, two tenants' namespaces and fresh images.
type nodeEnv struct {
	k        *kuberig.Kube
	v        kubeletVariant
	node     *kuberig.Node
	proxy    *ensureProxy
	nsA, nsB string
	plugins  pluginSetup
	// policy is the proxy's image policy (node_policy_test.go).
	policy *policySetup
	// kubeconfig is the proxy's: the node's own identity, as the kubelet's.
	kubeconfig string
	// mon is the proxy's monitoring address.
	mon string
}

// The images several scenarios share, as paths under a kubelet's
// repository (nodeEnv.image).
const (
	// privateImage needs credentials: scenario 1 pulls it as tenant A, with
	// its secret; most scenarios after it try it as B.
	privateImage = "private:v1"
	// publicImage is pulled through the anonymous registry (the same
	// storage): nodeEnv.anonymous.
	publicImage = "public:v1"
	// pluginImage is what the proxy's node-wide plugin matches (nodePlugins).
	pluginImage = "byplugin/app:v1"
	// tokenImage is what the token plugin matches (nodePlugins).
	tokenImage = "bysa/app:v1"
)

// image is the reference of path, an image of this kubelet's own
// repository, at the authenticated registry.
func (e *nodeEnv) image(path string) string {
	return testRig.Registry + "/" + e.repository() + "/" + path
}

// anonymous is the same image through the anonymous registry: public.
func (e *nodeEnv) anonymous(path string) string {
	return testRig.AnonRegistry + "/" + e.repository() + "/" + path
}

// repository is the kubelet's own, under which its images are pushed.
func (e *nodeEnv) repository() string { return "node-" + e.v.id }

// newNodeEnv starts v's node with images (paths under its repository)
// pushed first, each a fresh image no kubelet has seen.
func newNodeEnv(t *testing.T, k *kuberig.Kube, v kubeletVariant, images []string) *nodeEnv {
	t.Helper()
	bin := kuberig.KubeletBin(testRig, v.version)
	e := &nodeEnv{k: k, v: v, nsA: v.id + "-a", nsB: v.id + "-b"}
	ctx := context.Background()
	for _, ns := range []string{e.nsA, e.nsB} {
		if err := k.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	// Tenant A's secret is alice's credential, B's own secret bob's, and
	// B's wrong one bob's name with another password.
	for _, s := range []struct{ ns, name, user, password string }{
		{e.nsA, "regcred", "alice", rig.Users["alice"]},
		{e.nsB, "own", "bob", rig.Users["bob"]},
	} {
		createPullSecret(t, k, s.ns, s.name, s.user, s.password)
	}
	for ns, user := range map[string]string{e.nsA: "alice", e.nsB: "bob"} {
		createServiceAccount(t, k, ns, "builder", user)
	}

	for _, path := range images {
		ref := e.repository() + "/" + path
		if _, err := testRig.PushBusybox(ref, v.id+" "+ref); err != nil {
			t.Fatal(err)
		}
	}

	e.plugins = nodePlugins(t, testRig.Registry+"/"+e.repository())
	e.policy = nodePolicy(t, v)
	kubeconfig, err := k.WriteKubeconfig(kuberig.NodeUser)
	if err != nil {
		t.Fatal(err)
	}
	e.kubeconfig = kubeconfig
	e.mon = freeAddr(t)
	e.proxy = startEnsureProxy(t, "node-"+v.id, append([]string{"--kubeconfig", kubeconfig, "--monitoring-address", e.mon, "--node-name", kuberig.NodeName,
		"--image-credential-provider-config", e.plugins.config, "--image-credential-provider-bin-dir", e.plugins.binDir}, e.policy.flags()...)...)
	e.node, err = kuberig.StartNode(testRig, k, kuberig.KubeletOptions{Bin: bin, CRIEndpoint: e.proxy.ep, FeatureGates: v.gates})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet %s Ready, node %s, proxy log %s, kubelet dir %s", e.node.Version, e.node.Name, e.proxy.proc.Log, e.node.Dir)
	t.Cleanup(func() { e.tearDown(t) })
	return e
}

// tearDown deletes the variant's pods while the kubelet runs (it stops
// their containers), then stops the kubelet and removes what it left.
func (e *nodeEnv) tearDown(t *testing.T) {
	ctx := context.Background()
	zero := int64(0)
	for _, ns := range []string{e.nsA, e.nsB} {
		e.k.Admin.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		for _, ns := range []string{e.nsA, e.nsB} {
			if l, err := e.k.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
				n += len(l.Items)
			}
		}
		if n == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if t.Failed() {
		t.Logf("kubelet log (last lines):\n%s", tail(e.node.Log(), 40))
	}
	e.node.Stop()
	if err := kuberig.RemoveKubeletPods(ctx, testRig); err != nil {
		t.Errorf("removing the kubelet's sandboxes: %v", err)
	}
}

// nodePlugins writes the proxy's providers for the node tests: the
// reference plugin with node-wide credentials (user) for prefix/byplugin
// (pluginImage), and the token plugin for prefix/bysa (tokenImage).
func nodePlugins(t *testing.T, prefix string) pluginSetup {
	t.Helper()
	s := newPluginDir(t, "nodeplugins")
	dir := s.dir
	dockerConfig := filepath.Join(dir, "config.json")
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": "user", "password": rig.Users["user"]}}})
	os.WriteFile(dockerConfig, b, 0o600)
	creds := s.writeTokenUsers(t)
	s.wrap(t, "node-creds", pluginBin)
	s.wrap(t, "token-provider", tokenBin)
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: node-creds
    matchImages: ["%[1]s/byplugin"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--docker-config", "%[2]s"]
  - name: token-provider
    matchImages: ["%[1]s/bysa"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["--for-tests-only", "--audience", "%[3]s", "--credentials", "%[4]s", "--log", "%[5]s"]
    tokenAttributes:
      serviceAccountTokenAudience: %[3]s
      cacheType: ServiceAccount
      requireServiceAccount: true
      requiredServiceAccountAnnotationKeys: ["registry.test/user"]
`, prefix, dockerConfig, nodeAudience, creds, filepath.Join(dir, "claims.log"))
	os.WriteFile(s.config, []byte(cfg), 0o644)
	return s
}

func createPullSecret(t *testing.T, k *kuberig.Kube, ns, name, user, password string) {
	t.Helper()
	createPullSecretFor(t, k, ns, name, testRig.Registry, user, password)
}

// createPullSecretFor creates a pull secret whose credential is for
// registry (a name containerd's hosts.toml maps to the rig's registry).
func createPullSecretFor(t *testing.T, k *kuberig.Kube, ns, name, registry, user, password string) {
	t.Helper()
	data, _ := json.Marshal(map[string]any{"auths": map[string]any{registry: map[string]string{"username": user, "password": password}}})
	_, err := k.Admin.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
		Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: data}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// podSpec is what the scenarios vary in a pod.
type podSpec struct {
	ns, name, image string
	policy          corev1.PullPolicy
	secret          string // an imagePullSecret, when set
	account         string // its service account (default: "default")
	// volumeImage, when set, is mounted at /vol as an image volume
	// (KEP-4639) with volumePolicy, and the container prints /vol/marker.
	volumeImage  string
	volumePolicy corev1.PullPolicy
}

// run creates the pod, bound to the node.
func (e *nodeEnv) run(t *testing.T, s podSpec) *corev1.Pod {
	t.Helper()
	no, zero := false, int64(0)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name},
		Spec: corev1.PodSpec{
			NodeName:                      kuberig.NodeName,
			ServiceAccountName:            s.account,
			AutomountServiceAccountToken:  &no,
			DNSPolicy:                     corev1.DNSDefault, // there is no cluster DNS
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "app", Image: s.image, ImagePullPolicy: s.policy,
				Command: []string{"sleep", "3600"}}},
		},
	}
	if s.secret != "" {
		p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: s.secret}}
	}
	if s.volumeImage != "" {
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: s.volumeImage, PullPolicy: s.volumePolicy}}}}
		c := &p.Spec.Containers[0]
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/vol", ReadOnly: true}}
		c.Command = []string{"sh", "-c", "cat /vol/marker; sleep 3600"}
	}
	p, err := e.k.Admin.CoreV1().Pods(s.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls the pod until cond holds, and fails the test with the
// pod's container state and events when it does not within bound.
func (e *nodeEnv) waitFor(t *testing.T, p *corev1.Pod, what string, bound time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(bound)
	var cur *corev1.Pod
	for {
		var err error
		cur, err = e.k.Admin.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err == nil && cond(cur) {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not %s within %v: %s; events: %s", p.Namespace, p.Name, what, bound, containerState(cur), e.eventSummary(p))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (e *nodeEnv) waitRunning(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	return e.waitFor(t, p, "Running", 3*time.Minute, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
}

// waitWaiting waits until the container waits for one of reasons.
func (e *nodeEnv) waitWaiting(t *testing.T, p *corev1.Pod, reasons ...string) *corev1.Pod {
	t.Helper()
	return e.waitFor(t, p, "waiting for "+strings.Join(reasons, " or "), 2*time.Minute, func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false
		}
		return slices.Contains(reasons, p.Status.ContainerStatuses[0].State.Waiting.Reason)
	})
}

// neverRan checks that the pod never started its container.
func (e *nodeEnv) neverRan(t *testing.T, p *corev1.Pod) {
	t.Helper()
	cur, err := e.k.Admin.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Status.Phase == corev1.PodRunning || (len(cur.Status.ContainerStatuses) == 1 && cur.Status.ContainerStatuses[0].RestartCount > 0) {
		t.Errorf("pod %s/%s ran: %s", p.Namespace, p.Name, containerState(cur))
	}
	if e.hasEvent(p, "Started", "") {
		t.Errorf("pod %s/%s has a Started event", p.Namespace, p.Name)
	}
}

func containerState(p *corev1.Pod) string {
	if p == nil {
		return "no pod"
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return "phase " + string(p.Status.Phase) + ", no container status"
	}
	b, _ := json.Marshal(p.Status.ContainerStatuses[0].State)
	return "phase " + string(p.Status.Phase) + ", state " + string(b)
}

func (e *nodeEnv) events(p *corev1.Pod) []corev1.Event {
	l, err := e.k.Admin.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
	if err != nil {
		return nil
	}
	return l.Items
}

// hasEvent reports whether the pod has an event of reason whose message
// contains substr.
func (e *nodeEnv) hasEvent(p *corev1.Pod, reason, substr string) bool {
	return slices.ContainsFunc(e.events(p), func(ev corev1.Event) bool {
		return ev.Reason == reason && strings.Contains(ev.Message, substr)
	})
}

func (e *nodeEnv) eventSummary(p *corev1.Pod) string {
	var out []string
	for _, ev := range e.events(p) {
		out = append(out, ev.Reason+": "+ev.Message)
	}
	return strings.Join(out, " | ")
}

// alone runs f with the kubelet moved onto containerd directly, the proxy
// out of its path (the kubelet's state kept), then moves it back onto the
// proxy: what the kubelet does by itself, as a control.
func (e *nodeEnv) alone(t *testing.T, f func()) {
	t.Helper()
	e.node.Pause()
	if err := e.node.Resume(direct()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		e.node.Pause()
		if err := e.node.Resume(e.proxy.ep); err != nil {
			t.Fatalf("the kubelet back on the proxy: %v", err)
		}
	}()
	f()
}

// deletePods deletes the pods at once and waits until they are gone.
func (e *nodeEnv) deletePods(t *testing.T, pods ...*corev1.Pod) {
	t.Helper()
	zero := int64(0)
	for _, p := range pods {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, pods...)
}

// runCounting runs the pod to Running and returns it with the number of
// verifications of image at its registry meanwhile (verificationsDuring).
func (e *nodeEnv) runCounting(t *testing.T, s podSpec, image string) (*corev1.Pod, int) {
	t.Helper()
	var p *corev1.Pod
	n := verificationsDuring(t, image, func() { p = e.waitRunning(t, e.run(t, s)) })
	return p, n
}

// ensureRunning returns the pod of s, Running: the one an earlier scenario
// made, or, where that scenario did not run (-run selected a later one
// alone), one made now. A scenario that builds on an earlier one's pod
// calls it first, so that it finds the node as in the whole sequence.
func (e *nodeEnv) ensureRunning(t *testing.T, s podSpec) *corev1.Pod {
	t.Helper()
	p, err := e.k.Admin.CoreV1().Pods(s.ns).Get(context.Background(), s.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		t.Logf("pod %s/%s, an earlier scenario's, is not there (that scenario did not run): made now", s.ns, s.name)
		p = e.run(t, s)
	case err != nil:
		t.Fatal(err)
	}
	return e.waitRunning(t, p)
}

// waitGone waits until the pods are deleted.
func (e *nodeEnv) waitGone(t *testing.T, pods ...*corev1.Pod) {
	t.Helper()
	waitUntil(t, time.Minute, func() error {
		for _, p := range pods {
			if _, err := e.k.Admin.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s/%s still there (%v)", p.Namespace, p.Name, err)
			}
		}
		return nil
	})
}
