package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cri-image-proxy/cri-image-proxy/test/rig/kuberig"
)

// Image policy under a real kubelet: the node's proxy runs the
// reference plugin (sigstore-image-policy) for the kubelet's namespace
// NAME-secure (nodeEnv.secureNamespace), which requires a signature by the
// test's key.

var staticPodPolicyScenario = nodeScenario{
	name: "image policy: a static pod of an unsigned image in a namespace with a policy is refused, the reason in its status; a signed one runs",
	run:  (*nodeEnv).scenarioStaticPodPolicy,
}

// secureNamespace is the namespace of this kubelet's node that requires a
// signature.
func (e *nodeEnv) secureNamespace() string { return e.v.id + "-secure" }

// nodePolicy is the node proxy's image policy: a signature by the key for
// the kubelet's secure namespace.
func nodePolicy(t *testing.T, v kubeletVariant) *policySetup {
	t.Helper()
	return newPolicySetup(t, policyOptions{namespaces: []string{v.id + "-secure"}})
}

// scenarioStaticPodPolicy: static pods (manifest files in the kubelet's
// staticPodPath: no API object, so no admission webhook ever sees them)
// of a namespace whose policy requires a signature. The unsigned one is
// refused at its pull, and its mirror pod's status says why; the signed
// one runs.
func (e *nodeEnv) scenarioStaticPodPolicy(t *testing.T) {
	ns := e.secureNamespace()
	if err := e.k.CreateNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	repo := e.repository() + "/static"
	signed := push(t, repo+"-signed:v1", "static-signed")
	signWithKey(t, signed, e.policy.key)
	push(t, repo+"-unsigned:v1", "static-unsigned")

	unsigned := e.staticPod(t, ns, "static-unsigned", e.anonymous("static-unsigned:v1"))
	st := e.waitFor(t, unsigned, "refused by the image policy", 2*time.Minute, func(p *corev1.Pod) bool {
		w := waiting(p)
		return w != nil && strings.Contains(w.Message, "image is not signed")
	})
	e.neverRan(t, unsigned)
	if !isStatic(st) {
		t.Errorf("pod %s/%s is not the mirror of a static pod: %v", st.Namespace, st.Name, st.Annotations)
	}
	t.Logf("unsigned static pod: %s: %s", waiting(st).Reason, waiting(st).Message)

	ok := e.staticPod(t, ns, "static-signed", e.anonymous("static-signed:v1"))
	e.waitRunning(t, ok)
	if log := e.proxy.proc.LogText(); !strings.Contains(log, `static=true`) {
		t.Errorf("the proxy's decision log does not say the pod is static")
	}
}

// staticPod writes a manifest of a pod of image in namespace into the
// kubelet's staticPodPath, removed when the test ends, and returns its
// mirror pod as the API will name it.
func (e *nodeEnv) staticPod(t *testing.T, namespace, name, image string) *corev1.Pod {
	t.Helper()
	no, zero := false, int64(0)
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  &no,
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sleep", "3600"}}},
		},
	}
	data, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(e.node.StaticPodPath(), name+".yaml")
	if err := os.WriteFile(manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(manifest) })
	// The mirror pod: the static pod's name with the node's.
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s-%s", name, kuberig.NodeName)}}
}

// waiting is the pod's container's waiting state, nil when it does not
// wait (or has no status yet).
func waiting(p *corev1.Pod) *corev1.ContainerStateWaiting {
	if p == nil || len(p.Status.ContainerStatuses) != 1 {
		return nil
	}
	return p.Status.ContainerStatuses[0].State.Waiting
}

// isStatic reports whether p is the mirror pod of a static pod.
func isStatic(p *corev1.Pod) bool {
	_, ok := p.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}
