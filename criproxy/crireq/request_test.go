package crireq

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestPodOf(t *testing.T) {
	t.Parallel()
	md := &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "secure", Uid: "uid-1"}
	for _, tc := range []struct {
		name string
		cfg  *runtimeapi.PodSandboxConfig
		want Pod
	}{
		{"a pod of the API server is not static", &runtimeapi.PodSandboxConfig{Metadata: md, Annotations: map[string]string{"kubernetes.io/config.source": "api"}},
			Pod{Namespace: "secure", Name: "web", UID: "uid-1"}},
		{"a pod from a manifest file is static", &runtimeapi.PodSandboxConfig{Metadata: md, Annotations: map[string]string{"kubernetes.io/config.source": "file"}},
			Pod{Namespace: "secure", Name: "web", UID: "uid-1", Static: true}},
		{"a pod from a manifest URL is static", &runtimeapi.PodSandboxConfig{Metadata: md, Annotations: map[string]string{"kubernetes.io/config.source": "http"}},
			Pod{Namespace: "secure", Name: "web", UID: "uid-1", Static: true}},
		{"no sandbox config is no pod", nil, Pod{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PodOf(tc.cfg); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
