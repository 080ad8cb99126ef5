package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// RemovePodSandbox drops the pod's grants once the runtime removed it.
func (g *Guard) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next criproxy.Next[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	uid, _ := g.runtime.PodUID(ctx, req.GetPodSandboxId()) // unknown: no grant to drop
	resp, err := next(ctx, req)
	if err == nil && uid != "" {
		g.grants.dropPod(uid)
	}
	return resp, err
}
