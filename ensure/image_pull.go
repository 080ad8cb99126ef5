package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// PullImage is the CRI adapter of Pull: each try goes on to the runtime
// (next) with its credential in Auth. It answers with the runtime's own
// response when the try that succeeded went on to the runtime, and with
// the image reference Pull gave when it answered from the node.
func (g *Guard) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	if req.GetImage().GetImage() == "" {
		// The caller's mistake: InvalidArgument, naming the field, nothing
		// forwarded.
		return nil, fmt.Errorf("image.image: required: %w", errdefs.ErrInvalidArgument)
	}
	// The runtime's answer to the try that went on to it last. Pull waits
	// for each try's forward to end before it returns.
	var answered *runtimeapi.PullImageResponse
	ref, err := g.pulls.Pull(ctx, req, func(ctx context.Context, try *runtimeapi.PullImageRequest) (string, error) {
		resp, err := next(ctx, try)
		answered = resp
		return resp.GetImageRef(), err
	})
	switch {
	case err != nil:
		return nil, err
	case answered != nil && answered.GetImageRef() == ref:
		return answered, nil // the runtime's answer, as it gave it
	}
	return &runtimeapi.PullImageResponse{ImageRef: g.runtime.RuntimeID(ref)}, nil // answered from the node
}
