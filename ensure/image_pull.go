package ensure

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// PullImage is the CRI adapter of Pull. Its tries are the request's own
// credential, then credential injection's (Credentials), each a
// PullImageRequest with the try's credential in Auth, checked by Verify
// (inside Pull) beside the runtime's pull (next). It answers with the
// runtime's own response when a try went on to the runtime, and with the
// image reference Pull gave when it answered from the node.
func (g *Guard) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	if req.GetImage().GetImage() == "" {
		// The caller's mistake: InvalidArgument, naming the field, nothing
		// forwarded.
		return nil, fmt.Errorf("image.image: required: %w", errdefs.ErrInvalidArgument)
	}
	var answered *runtimeapi.PullImageResponse // the runtime's answer to the try that succeeded
	tries := func(ctx context.Context, each func(context.Context, registry.Credential, Forward) (string, error)) (string, pullcred.Used, error) {
		try := func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
			var resp *runtimeapi.PullImageResponse
			ref, err := each(ctx, registry.CredentialOf(r.GetAuth()), func(ctx context.Context) (string, error) {
				var err error
				resp, err = next(ctx, r)
				return resp.GetImageRef(), err
			})
			if err != nil {
				return nil, err
			}
			if resp == nil || resp.GetImageRef() != ref {
				// Answered from the node: the ID as the runtime writes it.
				resp = &runtimeapi.PullImageResponse{ImageRef: g.runtime.RuntimeID(ref)}
			}
			return resp, nil
		}
		var resp *runtimeapi.PullImageResponse
		var used pullcred.Used
		var err error
		if g.credentials != nil {
			resp, used, err = g.credentials.Pull(ctx, req, try)
		} else {
			resp, err = try(ctx, req)
		}
		answered = resp
		return resp.GetImageRef(), used, err
	}
	ref, err := g.Pull(ctx, PullRequest{Image: req.GetImage().GetImage(), Pod: crireq.PodOf(req.GetSandboxConfig()), Auth: authOf(req.GetAuth())}, tries)
	switch {
	case err != nil:
		return nil, err
	case answered != nil && answered.GetImageRef() == ref:
		return answered, nil // the runtime's answer, as it gave it
	}
	return &runtimeapi.PullImageResponse{ImageRef: g.runtime.RuntimeID(ref)}, nil // answered from the node
}
