package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

var controlScenario = nodeScenario{
	name:   "control, the proxy not enforcing: B without a secret runs A's image unless the kubelet enforces",
	images: []string{privateImage},
	run:    (*nodeEnv).scenarioControl,
}

// scenarioControl shows what the proxy prevents: with a pass-through proxy
// in its place, a pod without credentials runs the image A pulled with
// its secret in scenario 1 (https://github.com/kubernetes/kubernetes/issues/18787), unless the kubelet enforces
// KEP-2535 itself.
func (e *nodeEnv) scenarioControl(t *testing.T) {
	e.ensureRunning(t, e.aPulledWithSecret())
	e.proxy.proc.Stop(10 * time.Second)
	plain, err := testRig.StartProxy(proxyBin, e.proxy.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		plain.Stop(10 * time.Second)
		e.proxy.start(t)
	}()
	p := e.run(t, podSpec{ns: e.nsB, name: "control", image: e.image(privateImage), policy: corev1.PullIfNotPresent})
	if e.v.gates["KubeletEnsureSecretPulledImages"] {
		e.waitWaiting(t, p, "ErrImagePull", "ImagePullBackOff")
		e.neverRan(t, p)
		t.Logf("the kubelet's own feature refuses it: %s", e.eventSummary(p))
		return
	}
	e.waitRunning(t, p)
	t.Logf("without enforcement the pod runs A's private image: %s", e.eventSummary(p))
}
