package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The scenarios of image volumes (KEP-4639): an image mounted into a
// container is an image the pod uses, decided as its own.

var volumeNoSecretScenario = nodeScenario{
	name:   "B's image volume of A's image, no secret: ErrImagePull; Never: ErrImageNeverPull; never started",
	needs:  []nodeNeed{imageVolumes},
	images: []string{publicImage, privateImage},
	run:    (*nodeEnv).scenarioVolumeNoSecret,
}

// scenarioVolumeNoSecret: tenant B mounts tenant A's private image (pulled
// by A in scenario 1) as an image volume, with no secret: the kubelet is
// told the image is absent, its pull fails at the registry (IfNotPresent)
// or it refuses (Never); B's container never starts, so it never reads a
// file of A's image.
func (e *nodeEnv) scenarioVolumeNoSecret(t *testing.T) {
	public, private := e.anonymous(publicImage), e.image(privateImage)
	e.ensureRunning(t, e.aPulledWithSecret())
	bare := e.run(t, podSpec{ns: e.nsB, name: "vol-no-secret", image: public, policy: corev1.PullIfNotPresent,
		volumeImage: private, volumePolicy: corev1.PullIfNotPresent})
	e.waitWaiting(t, bare, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, bare)
	t.Logf("volume without a secret: %s", e.eventSummary(bare))
	never := e.run(t, podSpec{ns: e.nsB, name: "vol-never", image: public, policy: corev1.PullIfNotPresent,
		volumeImage: private, volumePolicy: corev1.PullNever})
	e.waitWaiting(t, never, "ErrImageNeverPull")
	e.neverRan(t, never)
	t.Logf("volume, Never: %s", e.eventSummary(never))
	zero := int64(0)
	for _, p := range []*corev1.Pod{bare, never} {
		e.k.Admin.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	e.waitGone(t, bare, never)
}

var volumeOwnSecretScenario = nodeScenario{
	name:   "B's image volume with its own valid secret: Running, then re-used with no registry request",
	needs:  []nodeNeed{imageVolumes},
	images: []string{publicImage, "volume:v1"},
	run:    (*nodeEnv).scenarioVolumeOwnSecret,
}

// scenarioVolumeOwnSecret: B's own valid secret verifies the image volume
// at the registry once; a second pod with that secret re-uses it from the
// node.
func (e *nodeEnv) scenarioVolumeOwnSecret(t *testing.T) {
	public, vol := e.anonymous(publicImage), e.image("volume:v1")
	// A pulls it first with its secret, so that it is a private image on
	// the node when B comes.
	e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "vol-a", image: public, policy: corev1.PullIfNotPresent, secret: "regcred",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}))
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "vol-own-1", image: public, policy: corev1.PullIfNotPresent, secret: "own",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}, vol); n == 0 {
		t.Errorf("B's own secret was not checked at the registry for the volume")
	}
	if _, n := e.runCounting(t, podSpec{ns: e.nsB, name: "vol-own-2", image: public, policy: corev1.PullIfNotPresent, secret: "own",
		volumeImage: vol, volumePolicy: corev1.PullIfNotPresent}, vol); n != 0 {
		t.Errorf("%d registry requests for a second volume pod with a verified secret, want 0", n)
	}
}

var volumeCrictlScenario = nodeScenario{
	name:   "crictl create with an image mount of a hidden image: refused",
	needs:  []nodeNeed{imageVolumes},
	images: []string{publicImage, privateImage},
	run:    (*nodeEnv).scenarioVolumeCrictl,
}

// scenarioVolumeCrictl: the same image mount made with crictl through the
// proxy, in a sandbox of B's identity, is refused at CreateContainer. The
// mount is A's image of scenario 1; the container's own image is the
// public one of scenario 4, both on the node.
func (e *nodeEnv) scenarioVolumeCrictl(t *testing.T) {
	e.ensureRunning(t, e.aPulledWithSecret())
	e.ensureRunning(t, e.publicPulled())
	cfg := writeJSON(t, e.v.id+"-vol-sandbox.json", map[string]any{
		"metadata":      map[string]any{"name": "vol-crictl", "namespace": e.nsB, "uid": e.v.id + "-vol-crictl", "attempt": 1},
		"log_directory": filepath.Join(testRig.Dir, "pod-logs", e.v.id+"-vol-crictl"),
		"linux":         map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
	})
	podID := strings.TrimSpace(mustCrictl(t, e.proxy.ep, "runp", cfg))
	defer func() { crictl(t, e.proxy.ep, "stopp", podID); crictl(t, e.proxy.ep, "rmp", podID) }()
	r := crictl(t, e.proxy.ep, "create", podID, mountConfig(t, e.v.id+"-vol-crictl", e.anonymous(publicImage), e.image(privateImage), e.image(privateImage)), cfg)
	if r.Err == nil || !strings.Contains(r.Stderr, "PermissionDenied") {
		t.Errorf("crictl create with an image mount of a hidden image: %v\n%s", r.Err, fatalMessage(r.Stderr))
	}
}
