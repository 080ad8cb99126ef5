package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// CreateContainer is the CRI adapter of Admit: every image the container
// would see is admitted before the runtime creates it.
func (g *Guard) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	if err := crireq.CreateShape(req); err != nil {
		return nil, err
	}
	if err := g.Admit(ctx, crireq.PodOf(req.GetSandboxConfig()), crireq.ContainerImages(req.GetConfig())); err != nil {
		return nil, err
	}
	return next(ctx, req)
}
