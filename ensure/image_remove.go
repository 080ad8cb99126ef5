package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

func init() {
	register(func(g *Guard) criproxy.Interceptor { return criproxy.Intercept(criproxy.RemoveImage, g.RemoveImage) })
}

// RemoveImage drops the image's record once the runtime removed it.
func (g *Guard) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest, next criproxy.Next[runtimeapi.RemoveImageRequest, runtimeapi.RemoveImageResponse]) (*runtimeapi.RemoveImageResponse, error) {
	ref, _, _ := g.resolve(ctx, queryOf(req.GetImage()))
	resp, err := next(ctx, req)
	if err != nil || ref == "" {
		return resp, err
	}
	// containerd removes the image with every name it has; if some name
	// is left (another runtime), the record must stay. A pull of the image
	// finishing meanwhile records after the forget (refLocks).
	unlock := g.refs.lock(ref)
	defer unlock()
	if _, present, serr := g.runtime.Image(ctx, ImageQuery{Name: ref}); serr == nil && !present {
		if _, ferr := g.store.Forget(ref); ferr != nil {
			g.log.Error("dropping the record of a removed image failed; GC will", "imageRef", ref, "err", ferr)
		}
		g.grants.dropImage(ref)
	}
	return resp, nil
}
