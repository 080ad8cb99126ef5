package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

func init() {
	register(func(g *Guard) criproxy.Interceptor {
		return criproxy.InterceptFiltered(criproxy.ImageStatus, g.ImageStatus, g.WantsImageStatus)
	})
}

// ImageStatus answers "not present" for a present image whose repository
// needs verification; see the package documentation.
func (g *Guard) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, next criproxy.Next[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse]) (*runtimeapi.ImageStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil || resp.GetImage() == nil {
		return resp, err
	}
	name := req.GetImage().GetImage()
	repo, ok := g.repository(name)
	if !ok || !g.listedAs(repo, resp.Image.GetRepoTags(), resp.Image.GetRepoDigests()) {
		return resp, nil // a lookup by ID: answered as the runtime answers, CreateContainer decides
	}
	d := g.countedDecide(resp.Image.Id, repo)
	if !d.verify {
		return resp, nil
	}
	if ok, why := g.showToWaiters(ctx, name, resp.Image.Id, repo); ok {
		g.logDecision(ctx, "ImageStatus: shown", name, resp.Image.Id, "", why)
		return resp, nil
	}
	g.hidden.add(name, resp.Image.Id, g.clock.Now())
	g.metrics.hidden.Inc()
	g.logDecision(ctx, "ImageStatus: hidden", name, resp.Image.Id, "", d.rule)
	return &runtimeapi.ImageStatusResponse{}, nil
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
