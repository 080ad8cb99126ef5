package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The scenarios of pull secrets and pull policies: tenant A's private image
// pulled with its secret, then tried by tenant B without one, with its
// own, and after A's secret changed; a public image; a moved tag.

var secretScenario = nodeScenario{
	name:   "A, pull secret: Running",
	images: []string{privateImage},
	run:    (*nodeEnv).scenarioSecret,
}

// aPulledWithSecret is scenario 1's pod: A's private image, pulled with
// A's secret. The scenarios after it that try that image (as B, or after
// a fault) start from it: ensureRunning makes it where scenario 1 did not
// run.
func (e *nodeEnv) aPulledWithSecret() podSpec {
	return podSpec{ns: e.nsA, name: "secret", image: e.image(privateImage), policy: corev1.PullIfNotPresent, secret: "regcred"}
}

func (e *nodeEnv) scenarioSecret(t *testing.T) {
	private := e.image(privateImage)
	p, n := e.runCounting(t, e.aPulledWithSecret(), private)
	if n == 0 {
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

var noSecretScenario = nodeScenario{
	name:   "B, no secret: ErrImagePull; Never: ErrImageNeverPull; CreateContainer refused",
	images: []string{privateImage},
	run:    (*nodeEnv).scenarioNoSecret,
}

// scenarioNoSecret: B tries A's image, pulled in scenario 1.
func (e *nodeEnv) scenarioNoSecret(t *testing.T) {
	ctx := context.Background()
	private := e.image(privateImage)
	e.ensureRunning(t, e.aPulledWithSecret())
	bare := e.run(t, podSpec{ns: e.nsB, name: "no-secret", image: private, policy: corev1.PullIfNotPresent})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, bare)
	if refusal := registryRefusal(t, private, nil); !e.hasEvent(bare, "Failed", refusal) {
		t.Errorf("no Failed event with the registry's refusal %q: %s", refusal, e.eventSummary(bare))
	}
	t.Logf("without a secret: %s", e.eventSummary(bare))

	never := e.run(t, podSpec{ns: e.nsB, name: "never", image: private, policy: corev1.PullNever})
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
	r := crictl(t, e.proxy.ep, "create", podID, containerConfig(t, e.v.id+"-never-ctr", private, "true"), cfg)
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

var ownSecretScenario = nodeScenario{
	name:   "B, own valid secret: one registry round trip, then none",
	images: []string{privateImage},
	run:    (*nodeEnv).scenarioOwnSecret,
}

// scenarioOwnSecret: B with its own secret for A's image, pulled in
// scenario 1.
func (e *nodeEnv) scenarioOwnSecret(t *testing.T) {
	private := e.image(privateImage)
	e.ensureRunning(t, e.aPulledWithSecret())
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "own-1", image: private, policy: corev1.PullIfNotPresent, secret: "own"}, private); n == 0 {
		t.Errorf("B's own secret was not checked at the registry")
	}
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "own-2", image: private, policy: corev1.PullIfNotPresent, secret: "own"}, private); n != 0 {
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

var publicScenario = nodeScenario{
	name:   "public image: Running everywhere, never re-verified",
	images: []string{publicImage},
	run:    (*nodeEnv).scenarioPublic,
}

// publicPulled is scenario 4's first pod: the public image, pulled by A
// with no credential.
func (e *nodeEnv) publicPulled() podSpec {
	return podSpec{ns: e.nsA, name: "public-1", image: e.anonymous(publicImage), policy: corev1.PullIfNotPresent}
}

func (e *nodeEnv) scenarioPublic(t *testing.T) {
	public := e.anonymous(publicImage)
	e.waitRunning(t, e.run(t, e.publicPulled()))
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "public-2", image: public, policy: corev1.PullIfNotPresent}, public); n != 0 {
		t.Errorf("%d registry requests for a public image already on the node, want 0", n)
	}
}

var alwaysScenario = nodeScenario{
	name: "Always pulls a moved tag",
	run:  (*nodeEnv).scenarioAlways, // it pushes its image, twice
}

func (e *nodeEnv) scenarioAlways(t *testing.T) {
	const path = "moving:latest"
	ref, moving := e.repository()+"/"+path, e.image(path)
	d1, err := testRig.PushBusybox(ref, e.v.id+" first")
	if err != nil {
		t.Fatal(err)
	}
	p1 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "always-1", image: moving, policy: corev1.PullAlways, secret: "regcred"}))
	d2, err := testRig.PushBusybox(ref, e.v.id+" second")
	if err != nil {
		t.Fatal(err)
	}
	p2 := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "always-2", image: moving, policy: corev1.PullAlways, secret: "regcred"}))
	if got := p1.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, d1) {
		t.Errorf("the first pod runs %s, want %s", got, d1)
	}
	if got := p2.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(got, d2) {
		t.Errorf("after the tag moved, the Always pod runs %s, want %s", got, d2)
	}
}

var rotatedSecretScenario = nodeScenario{
	name:   "A's pull secret rotated (same secret, new password): Running with no registry request",
	images: []string{privateImage},
	run:    (*nodeEnv).scenarioRotatedSecret,
}

// scenarioRotatedSecret: tenant A rotates its pull secret in place (same
// namespace, name and UID; another valid credential). As the kubelet
// documents, its pods keep using the image pulled with the old content
// (in scenario 1), with no registry request.
func (e *nodeEnv) scenarioRotatedSecret(t *testing.T) {
	ctx := context.Background()
	e.ensureRunning(t, e.aPulledWithSecret())
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
	private := e.image(privateImage)
	if _, n := e.runCounting(t, podSpec{ns: e.nsA, name: "rotated", image: private, policy: corev1.PullIfNotPresent, secret: "regcred"}, private); n != 0 {
		t.Errorf("%d registry requests for a pod of the rotated secret, want 0", n)
	}
}
