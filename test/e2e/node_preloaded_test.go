package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig"
)

var preloadedScenario = nodeScenario{
	name: "a preloaded image stays preloaded (Kubernetes issue 138175): B's `Never` pods of an image preloaded around the kubelet under two names (another tag of a repository, another repository) run; " +
		"after A's pod pulls the same digest with its secret as a third tag, through the proxy they still run, also after a proxy restart, and B's `Never` pod of A's tag gets ErrImageNeverPull; " +
		"the control, the kubelet alone on containerd with its ensure on: B's `Never` pod of the preloaded name gets ErrImageNeverPull (the kubelet's bug), as it does through the proxy in front of that kubelet",
	run: (*nodeEnv).scenarioPreloaded,
}

// scenarioPreloaded: one digest, pushed under three names of this
// kubelet's repository: preloaded/base:node and preloaded-other/base:node
// are pulled straight at containerd (around the kubelet and the proxy:
// preloaded); A's pod then pulls preloaded/base:v1 with its secret.
//
// A kubelet whose own ensure is on decides before the proxy is asked, and
// has the bug itself: it keys "pulled by the kubelet" by image ID, so
// after A's pull it sends B's Never pods of the preloaded names to
// ErrImageNeverPull, through the proxy or alone. (Its fix under review,
// https://github.com/kubernetes/kubernetes/pull/139156, covers the other repository only: it
// forgets a repository at its first pull, so the same repository's
// preloaded tag stays refused.) The kubelets that leave enforcement to the
// proxy (its ensure off, and the old one) run them.
func (e *nodeEnv) scenarioPreloaded(t *testing.T) {
	const a, b, other = "preloaded/base:v1", "preloaded/base:node", "preloaded-other/base:node"
	for _, path := range []string{a, b, other} {
		if _, err := testRig.PushBusybox(e.repository()+"/"+path, "preloaded "+e.v.id); err != nil {
			t.Fatal(err)
		}
	}
	sameRepo, otherRepo, aTag := e.image(b), e.image(other), e.image(a)
	for _, img := range []string{sameRepo, otherRepo} {
		mustCrictl(t, direct(), "pull", "--creds", "alice:"+rig.Users["alice"], img)
	}
	id := imageID(t, sameRepo)
	defer func() { crictl(t, direct(), "rmi", id) }()
	n := 0
	bNever := func(image string) *corev1.Pod {
		n++
		return e.run(t, podSpec{ns: e.nsB, name: fmt.Sprintf("preloaded-b-%d", n), image: image, policy: corev1.PullNever})
	}
	runs := func(image, when string) {
		t.Helper()
		p := e.waitRunning(t, bNever(image))
		t.Logf("%s: B's Never pod of %s runs", when, image)
		e.deletePods(t, p)
	}
	refused := func(image, when string) {
		t.Helper()
		p := bNever(image)
		e.waitWaiting(t, p, "ErrImageNeverPull")
		e.neverRan(t, p)
		t.Logf("%s: B's Never pod of %s: %s", when, image, e.eventSummary(p))
		e.deletePods(t, p)
	}

	runs(sameRepo, "before A's pull")
	runs(otherRepo, "before A's pull")
	pa := e.waitRunning(t, e.run(t, podSpec{ns: e.nsA, name: "preloaded-a", image: aTag, policy: corev1.PullIfNotPresent, secret: "regcred"}))
	defer e.deletePods(t, pa)
	if got := imageID(t, aTag); got != id {
		t.Fatalf("A's tag is %s, the preloaded image %s: the scenario needs one digest", got, id)
	}
	refused(aTag, "after A's pull, A's tag")

	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.alone(t, func() {
			refused(otherRepo, "control, the kubelet alone with its ensure on, after A's pull (another repository)")
			refused(sameRepo, "control, the kubelet alone with its ensure on, after A's pull (the same repository)")
		})
		refused(otherRepo, "through the proxy, in front of the kubelet with its ensure on (it decides first)")
		return
	}
	runs(sameRepo, "after A's pull, through the proxy")
	runs(otherRepo, "after A's pull, through the proxy")
	e.proxy.proc.Stop(10 * time.Second)
	e.proxy.start(t)
	runs(sameRepo, "after a proxy restart")
	refused(aTag, "after a proxy restart, A's tag")
}
