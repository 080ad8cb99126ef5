package ensure

import (
	"context"
	"fmt"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// CreateContainer is the CRI adapter of Admit: every image the container
// would see is admitted before the runtime creates it.
func (g *Guard) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	if err := g.Admit(ctx, podOf(req.GetSandboxConfig()), containerImages(req.GetConfig())); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

// containerImages returns every image a container would see: its own
// image and the image of each image volume mount (KEP-4639; containerd
// 2.1+ mounts config.mounts[].image read-only). A mount whose image spec
// names nothing is left to the runtime, which refuses it.
func containerImages(cfg *runtimeapi.ContainerConfig) []ImageUse {
	uses := []ImageUse{{Image: queryOf(cfg.GetImage()), Field: "image"}}
	for i, m := range cfg.GetMounts() {
		if m.GetImage().GetImage() != "" {
			uses = append(uses, ImageUse{Image: queryOf(m.GetImage()), Field: fmt.Sprintf("mounts[%d].image", i)})
		}
	}
	return uses
}
