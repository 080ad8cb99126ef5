package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// ImageStatus is the CRI adapter of Hide: a present image the guard hides
// is answered "not present".
func (g *Guard) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, next criproxy.Next[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse]) (*runtimeapi.ImageStatusResponse, error) {
	resp, err := next(ctx, req)
	switch {
	case err != nil:
		return resp, err
	case resp.GetImage() == nil:
		// Absent now: a hide of the name from before (the image removed
		// since) must not make the next pull take it for present.
		g.hidden.forget(req.GetImage().GetImage())
		return resp, nil
	}
	if g.Hide(ctx, req.GetImage().GetImage(), imageref.CanonicalID(resp.Image.GetId()), resp.Image.GetRepoTags(), resp.Image.GetRepoDigests()) {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return resp, nil
}

// WantsImageStatus lets ImageStatus calls the guard can never hide pass
// undecoded (see criproxy.InterceptFiltered): lookups by ID, and, by policy,
// repositories no record restricts and no pull in flight concerns. It
// reads memory only.
func (g *Guard) WantsImageStatus(req *runtimeapi.ImageStatusRequest) bool {
	repo, ok := g.repository(req.GetImage().GetImage())
	if !ok {
		return false
	}
	return g.repoMayNeedVerification(repo)
}
