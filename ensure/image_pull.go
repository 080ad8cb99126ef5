package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// PullImage is the CRI adapter of Pull.
func (g *Guard) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	var forwarded *runtimeapi.PullImageResponse
	ref, err := g.Pull(ctx, PullRequest{Image: req.GetImage().GetImage(), Pod: podOf(req.GetSandboxConfig()), Auth: authOf(req.GetAuth())},
		func(ctx context.Context) (string, error) {
			resp, err := next(ctx, req)
			forwarded = resp
			return resp.GetImageRef(), err
		})
	switch {
	case err != nil:
		return nil, err
	case forwarded != nil:
		return forwarded, nil // the runtime's answer, as it gave it
	}
	return &runtimeapi.PullImageResponse{ImageRef: ref}, nil // answered from the node
}
