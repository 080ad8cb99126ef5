package imagepolicy

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// FuzzDecodeConfig: whatever a configuration file holds, decoding and
// validating it returns a configuration or errors, never a panic; a
// provider that validates has a known failure policy and no negative
// duration.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{
		"apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\nproviders:\n- {name: sigstore-image-policy, apiVersion: imagepolicy.cri-image-proxy.io/v1alpha1, matchImages: [registry.test], namespaces: [secure], timeout: 1s, denyCacheDuration: 0s}\n",
		"apiVersion: config.cri-image-proxy.io/v1alpha1\nkind: ImagePolicyConfig\ndefaultNamespace: x\nproviders:\n- {name: a, namespaces: ['*', b], matchImages: ['*.[', ':'], failurePolicy: Open, timeout: -1s}\n",
		`{"apiVersion":"config.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyConfig","providers":[{"env":[{"name":""}]}]}`,
		"", "[]", "providers: {}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fc, err := decodeConfig(data)
		if err != nil {
			return
		}
		for i, pc := range fc.Providers {
			p, errs := validateProvider(field.NewPath("providers").Index(i), pc, "testdata/bin")
			if len(errs) > 0 {
				continue
			}
			if (p.FailurePolicy != Fail && p.FailurePolicy != Ignore) || p.Timeout <= 0 || p.AllowCacheDuration < 0 || p.DenyCacheDuration < 0 || len(p.Namespaces) == 0 {
				t.Fatalf("validated %+v", p)
			}
			newMatcher(p)
		}
	})
}
