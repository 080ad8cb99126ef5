package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// RemoveImage is the CRI adapter of Remove.
func (g *Guard) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest, next criproxy.Next[runtimeapi.RemoveImageRequest, runtimeapi.RemoveImageResponse]) (*runtimeapi.RemoveImageResponse, error) {
	var resp *runtimeapi.RemoveImageResponse
	err := g.Remove(ctx, crireq.QueryOf(req.GetImage()), func(ctx context.Context) (err error) {
		resp, err = next(ctx, req)
		return err
	})
	return resp, err
}
