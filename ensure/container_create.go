package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// CreateContainer is the CRI adapter of Admit: every image the container
// would see is admitted before the runtime creates it.
func (g *Guard) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next criproxy.Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	if err := createShape(req); err != nil {
		return nil, err
	}
	if err := g.Admit(ctx, podOf(req.GetSandboxConfig()), containerImages(req.GetConfig())); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

// createShape checks that a CreateContainer names what the decision needs:
// a missing part is the caller's mistake (InvalidArgument, naming the
// field), and nothing is forwarded.
func createShape(req *runtimeapi.CreateContainerRequest) error {
	switch {
	case req.GetConfig() == nil:
		return fmt.Errorf("config: required: %w", errdefs.ErrInvalidArgument)
	case req.GetConfig().GetImage() == nil:
		return fmt.Errorf("config.image: required: %w", errdefs.ErrInvalidArgument)
	case req.GetConfig().GetImage().GetImage() == "":
		return fmt.Errorf("config.image.image: required: %w", errdefs.ErrInvalidArgument)
	}
	return nil
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
