package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig"
	"github.com/cri-image-proxy/cri-image-proxy/internal/rig/kuberig"
)

// The node tests run the product under a real kubelet: one-node cluster on
// this machine (etcd, kube-apiserver with Node,RBAC and NodeRestriction, a
// kubelet whose runtime endpoint is the proxy, containerd, the
// password-protected registry), real pods bound by spec.nodeName, on the
// current kubelet with its own KEP-2535 feature off and on, and on one from
// before KEP-2535 and KEP-4412, the proxy's main customer.
//
// The proxy runs with the node's credentials (system:node:127.0.0.1), so
// the Node authorizer, NodeRestriction and the token audience restriction
// (deploy/kubernetes/token-audiences.yaml) apply to it as they would on a
// node.

// kubeletVariant is a kubelet the scenarios run on.
type kubeletVariant struct {
	name    string // a column of the result table
	id      string // a prefix for its namespaces and images
	version string
	gates   map[string]bool
}

var kubeletVariants = []kubeletVariant{
	{name: kuberig.KubeVersion + " (its ensure off)", id: "cur-off", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": false}},
	{name: kuberig.KubeVersion + " (its ensure on)", id: "cur-on", version: kuberig.KubeVersion, gates: map[string]bool{"KubeletEnsureSecretPulledImages": true}},
	{name: kuberig.OldKubeVersion + " (no KEP-2535/4412)", id: "old", version: kuberig.OldKubeVersion},
}

// nodeAudience is the token plugin's audience in the node tests; the node
// may request it through token-audiences.yaml.
const nodeAudience = "registry.node.test"

// nodeResults is the scenario x kubelet table the node tests print.
type nodeResults struct {
	runtime   string
	mu        sync.Mutex
	scenarios []string
	result    map[[2]string]string
}

func (r *nodeResults) set(scenario, variant, result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.scenarios, scenario) {
		r.scenarios = append(r.scenarios, scenario)
	}
	r.result[[2]string{scenario, variant}] = result
}

func (r *nodeResults) markdown() string {
	var b strings.Builder
	b.WriteString("| runtime | scenario |")
	for _, v := range kubeletVariants {
		b.WriteString(" kubelet " + v.name + " |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(kubeletVariants)) + "\n")
	sort.SliceStable(r.scenarios, func(i, j int) bool { return scenarioNumber(r.scenarios[i]) < scenarioNumber(r.scenarios[j]) })
	for _, s := range r.scenarios {
		b.WriteString("| " + r.runtime + " | " + s + " |")
		for _, v := range kubeletVariants {
			res := r.result[[2]string{s, v.name}]
			if res == "" {
				res = "not run"
			}
			b.WriteString(" " + res + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestNode(t *testing.T) {
	k := needKube(t) // it grants the nodes nodeAudience too
	results := &nodeResults{runtime: testRig.Runtime.Name, result: map[[2]string]string{}}
	t.Cleanup(func() {
		table := results.markdown()
		fmt.Printf("\nNode end-to-end results (scenario x kubelet, on %s):\n\n%s\n", testRig.Runtime.Name, table)
		os.MkdirAll("../_output", 0o755)
		os.WriteFile("../_output/e2e-node-containerd-"+testRig.Runtime.Line+".md", []byte(table), 0o644)
	})
	for _, v := range kubeletVariants {
		t.Run(v.name, func(t *testing.T) { runNodeScenarios(t, k, v, results) })
	}
}

// nodeEnv is one kubelet variant's node: the proxy in front of
// containerd, the kubelet, two tenants' namespaces and fresh images.
type nodeEnv struct {
	k        *kuberig.Kube
	v        kubeletVariant
	node     *kuberig.Node
	proxy    *ensureProxy
	nsA, nsB string
	plugins  pluginSetup
	// kubeconfig is the proxy's: the node's own identity, as the kubelet's.
	kubeconfig string
	// mon is the proxy's monitoring address.
	mon string
	// Images, pushed for this variant only (so that no kubelet has seen
	// them): private needs credentials; public is the same storage through
	// the anonymous registry.
	private, public, byPlugin, bySA, kill, full, moving string
}

func runNodeScenarios(t *testing.T, k *kuberig.Kube, v kubeletVariant, results *nodeResults) {
	e := newNodeEnv(t, k, v)
	for _, sc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"1. A, pull secret: Running", e.scenarioSecret},
		{"2. B, no secret: ErrImagePull; Never: ErrImageNeverPull; CreateContainer refused", e.scenarioNoSecret},
		{"3. B, own valid secret: one registry round trip, then none", e.scenarioOwnSecret},
		{"4. public image: Running everywhere, never re-verified", e.scenarioPublic},
		{"5. proxy plugin credentials (node-wide): Running", e.scenarioPlugin},
		{"6. token plugin: SA verified once, another SA verifies", e.scenarioServiceAccount},
		{"7. proxy restarted and kill -9'd during pulls", e.scenarioRestarts},
		{"8. Always pulls a moved tag", e.scenarioAlways},
		{"9. control, the proxy not enforcing: B without a secret runs A's image unless the kubelet enforces", e.scenarioControl},
		{"10. B's image volume of A's image, no secret: ErrImagePull; Never: ErrImageNeverPull; never started", e.scenarioVolumeNoSecret},
		{"11. B's image volume with its own valid secret: Running, then re-used with no registry request", e.scenarioVolumeOwnSecret},
		{"12. crictl create with an image mount of a hidden image: refused", e.scenarioVolumeCrictl},
		{"13. the token plugin's required annotation removed from A's account: its new pod must pull, and cannot", e.scenarioRoleRemoved},
		{"14. A's pull secret rotated (same secret, new password): Running with no registry request", e.scenarioRotatedSecret},
		{"15. the database full: A's record cannot be written; B's pods never run", e.scenarioFullDatabase},
		{"16. the proxy's identity is the node's: no secret, account or token of a pod on another node; told from the kubelet in the audit log", e.scenarioNodeIdentity},
		{"17. doctor: the kubelet's endpoints are the proxy's socket and it called just now; a proxy on another socket is reported bypassed", e.scenarioDoctor},
		{"18. the DaemonSet, from the image hack/image built: Ready under the kubelet; serves its host socket, plugin and records; gone with its pod", e.scenarioDaemonSet},
		{"19. records in the kubelet's format: its records imported (secrets left behind); the proxy's exported and honoured by the kubelet alone", e.scenarioKubeletFormat},
	} {
		ran, skipped := false, false
		ok := t.Run(sc.name, func(t *testing.T) {
			ran = true
			defer func() { skipped = t.Skipped() }()
			sc.run(t)
		})
		if !ran { // left out by -run
			continue
		}
		res := "pass"
		switch {
		case !ok:
			res = "**FAIL**"
		case skipped:
			res = "n/a"
		}
		results.set(sc.name, v.name, res)
	}
}

func newNodeEnv(t *testing.T, k *kuberig.Kube, v kubeletVariant) *nodeEnv {
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

	repo := "node-" + v.id
	push := func(ref string) string {
		if _, err := testRig.PushBusybox(ref, v.id+" "+ref); err != nil {
			t.Fatal(err)
		}
		return testRig.Registry + "/" + ref
	}
	e.private = push(repo + "/private:v1")
	e.public = testRig.AnonRegistry + "/" + strings.TrimPrefix(push(repo+"/public:v1"), testRig.Registry+"/")
	e.byPlugin = push(repo + "/byplugin/app:v1")
	e.bySA = push(repo + "/bysa/app:v1")
	e.kill = push(repo + "/kill/app:v1")
	e.full = push(repo + "/full/app:v1")
	e.moving = testRig.Registry + "/" + repo + "/moving:latest"

	e.plugins = nodePlugins(t, testRig.Registry+"/"+repo)
	kubeconfig, err := k.WriteKubeconfig(kuberig.NodeUser)
	if err != nil {
		t.Fatal(err)
	}
	e.kubeconfig = kubeconfig
	e.mon = freeAddr(t)
	e.proxy = startEnsureProxy(t, "node-"+v.id, "--kubeconfig", kubeconfig, "--monitoring-address", e.mon, "--node-name", kuberig.NodeName,
		"--image-credential-provider-config", e.plugins.config, "--image-credential-provider-bin-dir", e.plugins.binDir)
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
// reference plugin with node-wide credentials (user) for prefix/byplugin,
// and the token plugin for prefix/bysa.
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
	data, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": user, "password": password}}})
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

// pulls counts the successful requests the registries answered for
// repository paths under image's repository: a verification at the
// registry fetches the manifest (2xx); a re-use from the node makes none.
// Failed attempts (401s of pods without credentials) do not count.
func pulls(t *testing.T, image string) int {
	t.Helper()
	addr, rest, _ := strings.Cut(image, "/")
	repo := rest
	if i := strings.LastIndexAny(repo, ":@"); i > 0 {
		repo = repo[:i]
	}
	reqs, err := testRig.RegistryRequests()
	if addr == testRig.AnonRegistry {
		reqs, err = testRig.AnonRegistryRequests()
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r.Path, "/v2/"+repo+"/manifests/") && r.Status/100 == 2 {
			n++
		}
	}
	return n
}

func (e *nodeEnv) scenarioSecret(t *testing.T) {
	before := pulls(t, e.private)
	p := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "secret", image: e.private, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	if pulls(t, e.private) == before {
		t.Errorf("the image came without a registry request")
	}
	if !e.hasEvent(p, "Pulled", "") {
		t.Errorf("no Pulled event: %s", e.eventSummary(p))
	}
	if log := e.proxy.proc.LogText(); !strings.Contains(log, "RunPodSandbox") || !strings.Contains(log, "PullImage") {
		t.Errorf("the kubelet's CRI calls do not show in the proxy's log")
	}
	t.Logf("events: %s", e.eventSummary(p))
}

func (e *nodeEnv) scenarioNoSecret(t *testing.T) {
	ctx := context.Background()
	bare := e.run(t, podSpec{ns: e.nsB, name: "no-secret", image: e.private, policy: corev1.PullIfNotPresent})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, bare)
	if refusal := registryRefusal(t, e.private, nil); !e.hasEvent(bare, "Failed", refusal) {
		t.Errorf("no Failed event with the registry's refusal %q: %s", refusal, e.eventSummary(bare))
	}
	t.Logf("without a secret: %s", e.eventSummary(bare))

	never := e.run(t, podSpec{ns: e.nsB, name: "never", image: e.private, policy: corev1.PullNever})
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, never)
	if !e.hasEvent(never, "ErrImageNeverPull", "") {
		t.Errorf("no ErrImageNeverPull event: %s", e.eventSummary(never))
	}
	t.Logf("Never: %s", e.eventSummary(never))

	// Another route: a sandbox with the Never pod's identity, made with
	// crictl through the proxy, and a container of the image in it.
	cfg := writeJSON(t, e.v.id+"-never-sandbox.json", map[string]any{
		"metadata":      map[string]any{"name": never.Name, "namespace": never.Namespace, "uid": string(never.UID), "attempt": 7},
		"log_directory": filepath.Join(testRig.Dir, "pod-logs", e.v.id+"-never"),
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	})
	podID := strings.TrimSpace(mustCrictl(t, e.proxy.ep, "runp", cfg))
	defer func() { crictl(t, e.proxy.ep, "stopp", podID); crictl(t, e.proxy.ep, "rmp", podID) }()
	r := crictl(t, e.proxy.ep, "create", podID, containerConfig(t, e.v.id+"-never-ctr", e.private, "true"), cfg)
	if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") {
		t.Errorf("CreateContainer for the Never pod by another route: %v\n%s", r.Err, fatalMessage(r.Stderr))
	}
	t.Logf("CreateContainer by another route: %s", fatalMessage(r.Stderr))

	// Their retries would keep the image hidden from pods that may use it.
	zero := int64(0)
	for _, p := range []*corev1.Pod{bare, never} {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, bare, never)
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

func (e *nodeEnv) scenarioOwnSecret(t *testing.T) {
	before := pulls(t, e.private)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "own-1", image: e.private, policy: corev1.PullIfNotPresent, secret: "own"}))
	if pulls(t, e.private) == before {
		t.Errorf("B's own secret was not checked at the registry")
	}
	before = pulls(t, e.private)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "own-2", image: e.private, policy: corev1.PullIfNotPresent, secret: "own"}))
	if n := pulls(t, e.private) - before; n != 0 {
		t.Errorf("%d registry requests for a second pod with a verified secret, want 0", n)
	}
	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		// Both act here: the kubelet recorded B's secret too, and took the
		// image the proxy showed to own-2 on the strength of that record.
		recs, _ := e.node.PulledRecords()
		if !slices.ContainsFunc(recs, func(r string) bool {
			return strings.Contains(r, `"namespace":"`+e.nsB+`"`) && strings.Contains(r, `"name":"own"`)
		}) {
			t.Errorf("the kubelet has no record of B's secret; its records: %v", recs)
		}
	}
}

func (e *nodeEnv) scenarioPublic(t *testing.T) {
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "public-1", image: e.public, policy: corev1.PullIfNotPresent}))
	before := pulls(t, e.public)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "public-2", image: e.public, policy: corev1.PullIfNotPresent}))
	if n := pulls(t, e.public) - before; n != 0 {
		t.Errorf("%d registry requests for a public image already on the node, want 0", n)
	}
}

func (e *nodeEnv) scenarioPlugin(t *testing.T) {
	before := pulls(t, e.byPlugin)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "plugin-1", image: e.byPlugin, policy: corev1.PullIfNotPresent}))
	if pulls(t, e.byPlugin) == before {
		t.Errorf("the image came without a registry request")
	}
	if e.plugins.runs("node-creds") == 0 {
		t.Errorf("the proxy's plugin never ran")
	}
	before = pulls(t, e.byPlugin)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "plugin-2", image: e.byPlugin, policy: corev1.PullIfNotPresent}))
	if n := pulls(t, e.byPlugin) - before; n != 0 {
		t.Errorf("%d registry requests for an image pulled with node-wide credentials, want 0", n)
	}
}

func (e *nodeEnv) scenarioServiceAccount(t *testing.T) {
	before := pulls(t, e.bySA)
	a1 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "sa-1", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if pulls(t, e.bySA) == before {
		t.Errorf("the image came without a registry request")
	}
	if c := e.plugins.claims(t); len(c) == 0 || c[0]["podUID"] != string(a1.UID) || fmt.Sprint(c[0]["audience"]) != "["+nodeAudience+"]" {
		t.Errorf("the token plugin saw %v", c)
	}
	before = pulls(t, e.bySA)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "sa-2", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if pulls(t, e.bySA) == before {
		t.Errorf("another service account used the image without verifying")
	}
	before = pulls(t, e.bySA)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "sa-3", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"}))
	if n := pulls(t, e.bySA) - before; n != 0 {
		t.Errorf("%d registry requests for the same service account, want 0", n)
	}
}

func (e *nodeEnv) scenarioRestarts(t *testing.T) {
	ctx := context.Background()
	steady, err := e.k.Admin.CoreV1().Pods(e.nsA).Get(ctx, "secret", metav1.GetOptions{})
	if err != nil || len(steady.Status.ContainerStatuses) != 1 {
		t.Fatalf("scenario 1's pod: %v", err)
	}
	steadyID := steady.Status.ContainerStatuses[0].ContainerID

	k1 := e.run(t, podSpec{ns: e.nsA, name: "kill-1", image: e.kill, policy: corev1.PullIfNotPresent, secret: "regcred"})
	k2 := e.run(t, podSpec{ns: e.nsA, name: "kill-2", image: e.kill, policy: corev1.PullIfNotPresent, secret: "regcred"})
	kb := e.run(t, podSpec{ns: e.nsB, name: "kill-b", image: e.kill, policy: corev1.PullIfNotPresent})
	// SIGKILL three times while the kubelet starts them, then a graceful
	// restart.
	for i := range 3 {
		time.Sleep(time.Duration(i) * 300 * time.Millisecond)
		e.proxy.proc.Kill()
		e.proxy.start(t)
	}
	e.proxy.proc.Stop(10 * time.Second)
	e.proxy.start(t)

	e.waitRunning(t, k1)
	e.waitRunning(t, k2)
	e.waitWaiting(t, kb, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, kb)

	steady, err = e.k.Admin.CoreV1().Pods(e.nsA).Get(ctx, "secret", metav1.GetOptions{})
	if err != nil || steady.Status.ContainerStatuses[0].ContainerID != steadyID || steady.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("scenario 1's running pod was disturbed: %s", containerState(steady))
	}
	// What was verified before the kills still holds, and nobody else gets in.
	before := pulls(t, e.private)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "after-kills", image: e.private, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	if n := pulls(t, e.private) - before; n != 0 {
		t.Errorf("%d registry requests for A's verified image after the restarts, want 0", n)
	}
	never := e.run(t, podSpec{ns: e.nsB, name: "kill-never", image: e.kill, policy: corev1.PullNever})
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, never)
}

func (e *nodeEnv) scenarioAlways(t *testing.T) {
	ref := strings.TrimPrefix(e.moving, testRig.Registry+"/")
	d1, err := testRig.PushBusybox(ref, e.v.id+" first")
	if err != nil {
		t.Fatal(err)
	}
	p1 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "always-1", image: e.moving, policy: corev1.PullAlways, secret: "regcred"}))
	d2, err := testRig.PushBusybox(ref, e.v.id+" second")
	if err != nil {
		t.Fatal(err)
	}
	p2 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "always-2", image: e.moving, policy: corev1.PullAlways, secret: "regcred"}))
	if got := p1.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, d1) {
		t.Errorf("the first pod runs %s, want %s", got, d1)
	}
	if got := p2.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, d2) {
		t.Errorf("after the tag moved, the Always pod runs %s, want %s", got, d2)
	}
}

// scenarioControl shows what the proxy prevents: with a pass-through proxy
// in its place, a pod without credentials runs the image A pulled with
// its secret (kubernetes/kubernetes#18787), unless the kubelet enforces
// KEP-2535 itself.
func (e *nodeEnv) scenarioControl(t *testing.T) {
	e.proxy.proc.Stop(10 * time.Second)
	plain, err := testRig.StartProxy(proxyBin, e.proxy.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		plain.Stop(10 * time.Second)
		e.proxy.start(t)
	}()
	p := e.run(t, podSpec{ns: e.nsB, name: "control", image: e.private, policy: corev1.PullIfNotPresent})
	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.waitWaiting(t, p, "ErrImagePull", "ImagePullBackOff")
		e.neverRan(t, p)
		t.Logf("the kubelet's own feature refuses it: %s", e.eventSummary(p))
		return
	}
	e.waitRunning(t, p)
	t.Logf("without enforcement the pod runs A's private image: %s", e.eventSummary(p))
}

// scenarioNumber is the number a scenario's name starts with.
func scenarioNumber(name string) int {
	n := 0
	fmt.Sscanf(name, "%d.", &n)
	return n
}

// needImageVolumes skips on a kubelet without image volumes (KEP-4639:
// beta and on by default from 1.35; the old kubelet has it alpha and off).
func (e *nodeEnv) needImageVolumes(t *testing.T) {
	t.Helper()
	if e.v.version == kuberig.OldKubeVersion {
		t.Skipf("SKIPPED: kubelet %s has no image volumes (ImageVolume alpha, off)", e.v.version)
	}
	if testRig.Runtime.Legacy() {
		t.Skipf("SKIPPED: %s has no image volumes (containerd 2.1+)", testRig.Runtime.Name)
	}
}

// scenarioVolumeNoSecret: tenant B mounts tenant A's private image (pulled
// by A in scenario 1) as an image volume, with no secret: the kubelet is
// told the image is absent, its pull fails at the registry (IfNotPresent)
// or it refuses (Never); B's container never starts, so it never reads a
// file of A's image.
func (e *nodeEnv) scenarioVolumeNoSecret(t *testing.T) {
	e.needImageVolumes(t)
	bare := e.run(t, podSpec{ns: e.nsB, name: "vol-no-secret", image: e.public, policy: corev1.PullIfNotPresent,
		volumeImage: e.private, volumePolicy: corev1.PullIfNotPresent})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, bare)
	t.Logf("volume without a secret: %s", e.eventSummary(bare))
	never := e.run(t, podSpec{ns: e.nsB, name: "vol-never", image: e.public, policy: corev1.PullIfNotPresent,
		volumeImage: e.private, volumePolicy: corev1.PullNever})
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, never)
	t.Logf("volume, Never: %s", e.eventSummary(never))
	zero := int64(0)
	for _, p := range []*corev1.Pod{bare, never} {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, bare, never)
}

// scenarioVolumeOwnSecret: B's own valid secret verifies the image volume
// at the registry once; a second pod with that secret re-uses it from the
// node.
func (e *nodeEnv) scenarioVolumeOwnSecret(t *testing.T) {
	e.needImageVolumes(t)
	img := strings.TrimPrefix(e.private, testRig.Registry+"/")
	img = strings.Replace(img, "/private:", "/volume:", 1)
	if _, err := testRig.PushBusybox(img, e.v.id+" volume"); err != nil {
		t.Fatal(err)
	}
	vol := testRig.Registry + "/" + img
	// A pulls it first with its secret, so that it is a private image on
	// the node when B comes.
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "vol-a", image: e.public, policy: corev1.PullIfNotPresent, secret: "regcred",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}))
	before := pulls(t, vol)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "vol-own-1", image: e.public, policy: corev1.PullIfNotPresent, secret: "own",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}))
	if pulls(t, vol) == before {
		t.Errorf("B's own secret was not checked at the registry for the volume")
	}
	before = pulls(t, vol)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "vol-own-2", image: e.public, policy: corev1.PullIfNotPresent, secret: "own",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}))
	if n := pulls(t, vol) - before; n != 0 {
		t.Errorf("%d registry requests for a second volume pod with a verified secret, want 0", n)
	}
}

// scenarioVolumeCrictl: the same image mount made with crictl through the
// proxy, in a sandbox of B's identity, is refused at CreateContainer.
func (e *nodeEnv) scenarioVolumeCrictl(t *testing.T) {
	e.needImageVolumes(t)
	cfg := writeJSON(t, e.v.id+"-vol-sandbox.json", map[string]any{
		"metadata":      map[string]any{"name": "vol-crictl", "namespace": e.nsB, "uid": e.v.id + "-vol-crictl", "attempt": 1},
		"log_directory": filepath.Join(testRig.Dir, "pod-logs", e.v.id+"-vol-crictl"),
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	})
	podID := strings.TrimSpace(mustCrictl(t, e.proxy.ep, "runp", cfg))
	defer func() { crictl(t, e.proxy.ep, "stopp", podID); crictl(t, e.proxy.ep, "rmp", podID) }()
	r := crictl(t, e.proxy.ep, "create", podID, mountConfig(t, e.v.id+"-vol-crictl", e.public, e.private), cfg)
	if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") {
		t.Errorf("crictl create with an image mount of a hidden image: %v\n%s", r.Err, fatalMessage(r.Stderr))
	}
}

// scenarioRoleRemoved: removing the annotation the token plugin requires
// from a service account is how cloud operators revoke its access (an IAM
// role). The image the account pulled in scenario 6 must not be re-used
// by its new pods: they must pull, and with no role the plugin gives them
// nothing, so they never run.
func (e *nodeEnv) scenarioRoleRemoved(t *testing.T) {
	ctx := context.Background()
	accounts := e.k.Admin.CoreV1().ServiceAccounts(e.nsA)
	sa, err := accounts.Get(ctx, "builder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := sa.Annotations["registry.test/user"]
	delete(sa.Annotations, "registry.test/user")
	if _, err := accounts.Update(ctx, sa, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sa, err := accounts.Get(ctx, "builder", metav1.GetOptions{})
		if err == nil {
			sa.Annotations = map[string]string{"registry.test/user": role}
			_, err = accounts.Update(ctx, sa, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("restoring the role: %v", err)
		}
	}()
	p := e.run(t, podSpec{ns: e.nsA, name: "sa-no-role", image: e.bySA, policy: corev1.PullIfNotPresent, account: "builder"})
	e.waitWaiting(t, p, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, p)
	t.Logf("without its role: %s", e.eventSummary(p))
	zero := int64(0)
	e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	e.waitGone(t, p)
}

// scenarioRotatedSecret: tenant A rotates its pull secret in place (same
// namespace, name and UID; another valid credential). As the kubelet
// documents, its pods keep using the image pulled with the old content,
// with no registry request.
func (e *nodeEnv) scenarioRotatedSecret(t *testing.T) {
	ctx := context.Background()
	secrets := e.k.Admin.CoreV1().Secrets(e.nsA)
	setCredential := func(user string) {
		t.Helper()
		sec, err := secrets.Get(ctx, "regcred", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(map[string]any{"auths": map[string]any{testRig.Registry: map[string]string{"username": user, "password": rig.Users[user]}}})
		sec.Data[corev1.DockerConfigJsonKey] = data
		if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setCredential("user")
	defer setCredential("alice")
	before := pulls(t, e.private)
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "rotated", image: e.private, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	if n := pulls(t, e.private) - before; n != 0 {
		t.Errorf("%d registry requests for a pod of the rotated secret, want 0", n)
	}
}

// scenarioFullDatabase: the proxy's database fills up (a 1 MiB tmpfs,
// filled), so a verified pull cannot be recorded. Whichever write fails
// (the intent: A's pull is refused; the record: A runs), tenant B's pods
// must not run the image: it is never taken for a preloaded one. The
// proxy runs on a fresh database there, with two records written before
// the disk fills: then bbolt has room for the small intent and not for the
// record (measured), the case that matters, as the image is on the node.
func (e *nodeEnv) scenarioFullDatabase(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(testRig.Dir, "full-db-"+e.v.id)
	os.MkdirAll(dir, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	defer exec.Command("umount", "-l", dir).Run()
	origDB := e.proxy.db
	useDB := func(path string) {
		t.Helper()
		e.proxy.proc.Stop(10 * time.Second)
		for i, a := range e.proxy.args {
			if a == e.proxy.db {
				e.proxy.args[i] = path
			}
		}
		e.proxy.db = path
		e.proxy.start(t)
	}
	useDB(filepath.Join(dir, "ensure.db"))
	defer useDB(origDB)
	mustCrictl(t, e.proxy.ep, "pull", e.public)
	mustCrictl(t, e.proxy.ep, "pull", "--creds", "alice:"+rig.Users["alice"], e.private)
	filler := filepath.Join(dir, "filler")
	exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=4k").Run() // ends with ENOSPC, as meant
	defer os.Remove(filler)

	a := e.run(t, podSpec{ns: e.nsA, name: "full-a", image: e.full, policy: corev1.PullIfNotPresent, secret: "regcred"})
	a = e.waitFor(t, a, "Running, or failing its pull", 3*time.Minute, func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 {
			return false
		}
		st := p.Status.ContainerStatuses[0].State
		return st.Running != nil || (st.Waiting != nil && (st.Waiting.Reason == "ErrImagePull" || st.Waiting.Reason == "ImagePullBackOff"))
	})
	log := e.proxy.proc.LogText()
	recordFailed := strings.Contains(log, "recording a verified pull failed")
	intentFailed := strings.Contains(log, "noting a pull intent failed")
	if !recordFailed && !intentFailed {
		t.Fatalf("no write failed: the scenario tests nothing (A: %s)", containerState(a))
	}
	t.Logf("A: %s (record write failed: %v, intent write failed: %v)", containerState(a), recordFailed, intentFailed)

	bare := e.run(t, podSpec{ns: e.nsB, name: "full-b", image: e.full, policy: corev1.PullIfNotPresent})
	never := e.run(t, podSpec{ns: e.nsB, name: "full-b-never", image: e.full, policy: corev1.PullNever})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, bare)
	e.neverRan(t, never)
	t.Logf("B: %s; B Never: %s", e.eventSummary(bare), e.eventSummary(never))

	zero := int64(0)
	for _, p := range []*corev1.Pod{a, bare, never} {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, a, bare, never)
}
