package ensure

import (
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// adapters are the guard's CRI interceptors, one per intercepted method,
// each registered by the file that holds it (image_status.go,
// image_pull.go, image_remove.go, container_create.go, sandbox_remove.go):
// intercepting one more method is one more such file.
var adapters []func(*Guard) criproxy.Interceptor

func register(adapter func(*Guard) criproxy.Interceptor) { adapters = append(adapters, adapter) }

// Interceptors returns the guard's interceptors, for criproxy.New.
func (g *Guard) Interceptors() []criproxy.Interceptor {
	out := make([]criproxy.Interceptor, 0, len(adapters))
	for _, a := range adapters {
		out = append(out, a(g))
	}
	return out
}

// podName names a pod for the log, from the CRI sandbox metadata.
func podName(m *runtimeapi.PodSandboxMetadata) string {
	if m == nil {
		return "(no pod)"
	}
	return fmt.Sprintf("%s/%s (uid %s)", m.GetNamespace(), m.GetName(), m.GetUid())
}
