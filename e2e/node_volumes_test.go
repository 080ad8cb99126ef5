package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-image-proxy/cri-image-proxy/internal/rig/kuberig"
)

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
