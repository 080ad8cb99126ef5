package ensure

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// PullImage is the CRI adapter of Pull.
func (g *Guard) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	if req.GetImage().GetImage() == "" {
		// The caller's mistake: InvalidArgument, naming the field, nothing
		// forwarded.
		return nil, fmt.Errorf("image.image: required: %w", errdefs.ErrInvalidArgument)
	}
	return answerPull(ctx, req, next, func(forward Forward) (string, error) {
		return g.Pull(ctx, PullRequest{Image: req.GetImage().GetImage(), Pod: podOf(req.GetSandboxConfig()), Auth: authOf(req.GetAuth())}, forward)
	})
}

// VerifyPullImage is the CRI adapter of Verify: the innermost hook of a
// PullImage, inside credential injection, so that it sees the credential
// each try goes with.
func (g *Guard) VerifyPullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	return answerPull(ctx, req, next, func(forward Forward) (string, error) {
		return g.Verify(ctx, req.GetImage().GetImage(), podOf(req.GetSandboxConfig()), registryCredential(req.GetAuth()), forward)
	})
}

// answerPull runs a core pull call on a CRI request: forward is the rest
// of the chain. It answers with the runtime's own response when the call
// went on to the runtime, and with the image reference the core gave when
// it answered from the node.
func answerPull(ctx context.Context, req *runtimeapi.PullImageRequest, next criproxy.Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse],
	core func(Forward) (string, error)) (*runtimeapi.PullImageResponse, error) {
	var forwarded *runtimeapi.PullImageResponse
	ref, err := core(func(ctx context.Context) (string, error) {
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

// registryCredential is a CRI auth as the registry check takes it: the
// auth field, when it is all there is, decoded to its user and password as
// the runtime decodes it.
func registryCredential(a *runtimeapi.AuthConfig) registry.Credential {
	c := registry.Credential{Username: a.GetUsername(), Password: a.GetPassword(), IdentityToken: a.GetIdentityToken(), RegistryToken: a.GetRegistryToken()}
	if c.Username == "" && c.Password == "" && a.GetAuth() != "" {
		if dec, err := base64.StdEncoding.DecodeString(a.GetAuth()); err == nil {
			c.Username, c.Password, _ = strings.Cut(string(dec), ":")
		}
	}
	return c
}
