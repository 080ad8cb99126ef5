package ensure

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodsWhosePullSecretsDifferHaveDifferentEntitlementKeys: showToWaiters
// decides one pod per entitlement key and gives the others its answer, so
// two pods whose pull secret lists differ (and so may be entitled
// differently: entitled reads each secret by its name) must not share a
// key. The API does not validate the names in spec.imagePullSecrets (only
// that nothing but a name is set), so a name may hold the NUL the key joins
// names with: ["a\x00b"] (a secret that cannot exist, entitling nobody) and
// ["a", "b"] (b may entitle) must be told apart.
func TestPodsWhosePullSecretsDifferHaveDifferentEntitlementKeys(t *testing.T) {
	pod := func(ns, sa string, secrets ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{ServiceAccountName: sa}}
		for _, s := range secrets {
			p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		a, b *corev1.Pod
	}{
		{"one name holding a NUL, and the two names it joins", pod("ns", "sa", "a\x00b"), pod("ns", "sa", "a", "b")},
		{"a name ending in NUL, and that name then an empty one", pod("ns", "sa", "a\x00"), pod("ns", "sa", "a", "")},
		{"no secrets, and one empty name", pod("ns", "sa"), pod("ns", "sa", "")},
		{"other secrets", pod("ns", "sa", "a"), pod("ns", "sa", "b")},
		{"other accounts", pod("ns", "sa", "a"), pod("ns", "other", "a")},
		{"other namespaces", pod("ns", "sa", "a"), pod("other", "sa", "a")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if entitlementKeyOf(tc.a) == entitlementKeyOf(tc.b) {
				t.Errorf("pull secrets %q and %q share the key %q", names(tc.a), names(tc.b), entitlementKeyOf(tc.a))
			}
		})
	}
}

func names(p *corev1.Pod) []string {
	var out []string
	for _, r := range p.Spec.ImagePullSecrets {
		out = append(out, r.Name)
	}
	return out
}
