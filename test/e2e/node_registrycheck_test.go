package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

// The scenarios of the registry check, the registry's word and not the runtime's: the two
// setups in which the runtime's pull succeeds without the registry's word
// (TestTheRegistrysWordNotTheRuntimes shows them through crictl), by pods
// of two namespaces. Through the proxy, on every kubelet, B's pods are
// refused; the control, on the kubelet whose own ensure is on, is that
// kubelet alone on containerd, which lets B's pod run.

var mirrorScenario = nodeScenario{
	name: "a mirror in the runtime's registry configuration (hosts.toml, registries.conf) serves A's private image to anyone: through the proxy B's pods get ErrImagePull and ErrImageNeverPull, never Running; " +
		"the kubelet alone, its ensure on, pulls for B through the mirror and runs it (the control)",
	images: []string{"mirror/app:v1"},
	run:    (*nodeEnv).scenarioMirror,
}

// scenarioMirror: A's private image, under the registry's DNS-like name,
// pulled by A's pod with its secret for that name; then a mirror that
// serves anyone is first in containerd's hosts.toml for it (as a
// pull-through cache or a peer mirror would be); on CRI-O, a
// [[registry.mirror]] of the registry's own address.
func (e *nodeEnv) scenarioMirror(t *testing.T) {
	path := e.repository() + "/mirror/app"
	// On CRI-O, the registry's own address: CRI-O sends no credential to a
	// rewritten location (registry.rig.test's), and A's pull needs one.
	registry := privateRegistryName()
	image := registry + "/" + path + ":v1"
	createPullSecretFor(t, e.k, e.nsA, "regcred-dns", registry, "alice", rig.Users["alice"])
	a := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "mirror-a", image: image, policy: corev1.PullIfNotPresent, secret: "regcred-dns"}))
	id := imageID(t, image)
	mirrorForAnyone(t, registry)

	// The runtime pulls beside the registry check (through the mirror,
	// here) until the registry refuses B: B's pods never run whatever it did.
	b := e.run(t, podSpec{ns: e.nsB, name: "mirror-b", image: image, policy: corev1.PullIfNotPresent})
	bNever := e.run(t, podSpec{ns: e.nsB, name: "mirror-b-never", image: image, policy: corev1.PullNever})
	e.waitWaiting(t, b, "ErrImagePull", "ImagePullBackOff")
	e.waitWaiting(t, bNever, "ErrImageNeverPull")
	e.neverRan(t, b)
	e.neverRan(t, bNever)
	if events := e.eventSummary(b); strings.Contains(events, id) {
		t.Errorf("B's events name A's image ID: %s", events)
	}
	t.Logf("through the proxy, B: %s", e.eventSummary(b))
	e.deletePods(t, b, bNever)

	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.alone(t, func() {
			c := e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "mirror-b-alone", image: image, policy: corev1.PullIfNotPresent}))
			t.Logf("control: the kubelet alone, its ensure on, runs A's private image for B: %s", e.eventSummary(c))
			e.deletePods(t, c)
		})
	}
	e.deletePods(t, a)
	removeImageOnceFree(t, id)
}

var manifestOnlyScenario = nodeScenario{
	name: "B's own registry serves A's manifest under B's name and no blob: through the proxy B's pod gets ErrImagePull, never Running, and B's name is hidden if the runtime holds it; " +
		"the kubelet alone, its ensure on, pulls it for B and runs A's image (the control)",
	images: []string{"manifest/app:v1"},
	run:    (*nodeEnv).scenarioManifestOnly,
}

// scenarioManifestOnly: A's private image runs in A's pod; B, who knows
// its manifest, runs a registry of its own that answers it for b/app:v1
// and serves no blob, the content being on the node already.
func (e *nodeEnv) scenarioManifestOnly(t *testing.T) {
	imageA := e.image("manifest/app:v1")
	a := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "manifest-a", image: imageA, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	idA := imageID(t, imageA)
	manifest, mediaType := rawManifest(t, imageA)
	bReg := startManifestOnlyRegistry(t, "b/app", "v1", manifest, mediaType)
	if err := testRig.AddMirror(bReg, portOf(t, bReg)); err != nil {
		t.Fatal(err)
	}
	defer testRig.RemoveMirror(bReg)
	imageB := bReg + "/b/app:v1"

	b := e.run(t, podSpec{ns: e.nsB, name: "manifest-b", image: imageB, policy: corev1.PullIfNotPresent})
	e.waitWaiting(t, b, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, b)
	if _, ok := runtimeImage(t, imageB); ok {
		if r := crictl(t, e.proxy.ep, "inspecti", imageB); r.Err == nil {
			t.Errorf("the runtime holds %s and the proxy shows it", imageB)
		}
	}
	t.Logf("through the proxy, B: %s", e.eventSummary(b))
	e.deletePods(t, b)

	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.alone(t, func() {
			c := e.run(t, podSpec{ns: e.nsB, name: "manifest-b-alone", image: imageB, policy: corev1.PullIfNotPresent})
			if testRig.Runtime.CRIO() {
				// CRI-O fetches an image's config from the registry whatever
				// the node holds: B's registry, which serves no blob, fails
				// B's pull by itself, and the control shows that instead.
				e.waitWaiting(t, c, "ErrImagePull", "ImagePullBackOff")
				e.neverRan(t, c)
				t.Logf("control: %s fails B's pull by itself: %s", testRig.Runtime.Name, e.eventSummary(c))
				e.deletePods(t, c)
				return
			}
			c = e.waitRunning(t, c)
			if id := imageID(t, imageB); id != idA {
				t.Errorf("B's name stands for %s, not A's image %s", id, idA)
			}
			t.Logf("control: the kubelet alone, its ensure on, runs A's image under B's name: %s", e.eventSummary(c))
			e.deletePods(t, c)
		})
	}
	e.deletePods(t, a)
	// With all its names (B's too, after the control).
	removeImageOnceFree(t, idA)
}

var forgedConfigScenario = nodeScenario{
	name: "B's own registry serves, under B's name, a config of its own whose diff_ids are A's private layers, and made-up layer blobs (A's layer digests on CRI-O): through the proxy B's pod gets ErrImagePull, never Running, " +
		"and B's image is hidden if the runtime holds it; the kubelet alone, its ensure on, pulls it for B, and B's container reads A's file (the control)",
	images: []string{"forged/app:v1"},
	run:    (*nodeEnv).scenarioForgedConfig,
}

// scenarioForgedConfig: A's private image runs in A's pod; B, who learnt
// its diff_ids (a scan report, an SBOM), writes a config of its own that
// lists them, and serves it from a registry of its own, with layer blobs
// it never had: containerd reuses A's snapshots by their chain IDs.
func (e *nodeEnv) scenarioForgedConfig(t *testing.T) {
	imageA := e.image("forged/app:v1")
	marker := e.v.id + " " + e.repository() + "/forged/app:v1"
	a := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "forged-a", image: imageA, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	leaked := readLeakedImage(t, imageA)
	b := startTenantRegistry(t)
	cfg, desc := ownConfig(t, leaked, e.v.id)
	b.Blob("b/app", cfg)
	layers := madeUpLayers(len(leaked.descs))
	if testRig.Runtime.CRIO() {
		// CRI-O checks a layer it downloads against the config's diff_id,
		// so made-up blobs fail there by themselves; but it reuses a layer
		// it holds by its blob digest without asking the registry: A's
		// layer digests (as known as its diff_ids) are B's way on CRI-O.
		layers = leaked.descs
	}
	imageB := b.Manifest(t, "b/app", "v1", ociManifestType,
		ociManifest{SchemaVersion: 2, MediaType: ociManifestType, Config: desc, Layers: layers})

	pb := e.run(t, podSpec{ns: e.nsB, name: "forged-b", image: imageB, policy: corev1.PullIfNotPresent})
	e.waitWaiting(t, pb, "ErrImagePull", "ImagePullBackOff")
	e.neverRan(t, pb)
	if _, ok := runtimeImage(t, imageB); ok {
		if r := crictl(t, e.proxy.ep, "inspecti", imageB); r.Err == nil {
			t.Errorf("the runtime holds %s and the proxy shows it", imageB)
		}
	}
	if events := e.eventSummary(pb); strings.Contains(events, leaked.id) {
		t.Errorf("B's events name A's image ID: %s", events)
	}
	t.Logf("through the proxy, B: %s", e.eventSummary(pb))
	e.deletePods(t, pb)

	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.alone(t, func() {
			c := e.waitRunning(t, e.run(t, podSpec{ns: e.nsB, name: "forged-b-alone", image: imageB, policy: corev1.PullIfNotPresent}))
			ctr := strings.TrimSpace(mustCrictl(t, direct(), "ps", "-q", "--label", "io.kubernetes.pod.name=forged-b-alone"))
			if out := mustCrictl(t, direct(), "exec", ctr, "cat", "/marker"); !strings.Contains(out, marker) {
				t.Errorf("B's container read %q, not A's file: the control's premise is wrong", out)
			}
			t.Logf("control: the kubelet alone, its ensure on, runs A's layers for B under B's own image: %s", e.eventSummary(c))
			e.deletePods(t, c)
		})
		if id, ok := runtimeImage(t, imageB); ok {
			removeImageOnceFree(t, id)
		}
	}
	e.deletePods(t, a)
	removeImageOnceFree(t, leaked.id)
}

// removeImageOnceFree removes the image id from the runtime, once no
// container holds it: CRI-O refuses to remove an image a container still
// uses, and the kubelet removes a deleted pod's containers a moment after
// the pod is gone from the API (containerd removes it at once).
func removeImageOnceFree(t *testing.T, id string) {
	t.Helper()
	id = runtimeForm(id)
	waitUntil(t, 2*time.Minute, func() error {
		if r := crictl(t, direct(), "rmi", id); r.Err != nil {
			if _, held := runtimeImage(t, id); !held {
				return nil
			}
			return fmt.Errorf("crictl rmi %s: %v: %s", id, r.Err, crictlMessage(r.Stderr))
		}
		return nil
	})
}
