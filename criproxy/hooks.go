package criproxy

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A hook extends the proxy on one or more intercepted methods by
// implementing the matching interface below. Each receives the request and
// next, which continues the chain: the next hook, and finally the runtime.
// A hook may change the request, call next any number of times (say, once
// per candidate credential), or answer without calling it at all.
//
// Hooks are given to New in order, outermost first. A method that no hook
// implements is passed through without decoding, so an interception point
// costs nothing until something uses it.
//
// Errors a hook returns are mapped to gRPC status codes once, at the edge
// (see ToStatus): return runtime errors as they are, and wrap local ones
// around the sentinels of github.com/containerd/errdefs.

// PullImageFunc continues a PullImage call.
type PullImageFunc = func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error)

// PullImageHook intercepts ImageService.PullImage.
type PullImageHook interface {
	PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next PullImageFunc) (*runtimeapi.PullImageResponse, error)
}

// ImageStatusFunc continues an ImageStatus call.
type ImageStatusFunc = func(context.Context, *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error)

// ImageStatusHook intercepts ImageService.ImageStatus. It is on the
// kubelet's hot path: keep it to in-memory work or a single store read.
type ImageStatusHook interface {
	ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, next ImageStatusFunc) (*runtimeapi.ImageStatusResponse, error)
}

// ImageStatusFilter may be implemented by an ImageStatusHook to decline
// calls after seeing only the request: when every ImageStatus hook
// declines, the call is forwarded as raw frames and its response is never
// decoded, as if no hook were there. It must be cheap: it runs on every
// ImageStatus.
type ImageStatusFilter interface {
	WantsImageStatus(req *runtimeapi.ImageStatusRequest) bool
}

// RemoveImageFunc continues a RemoveImage call.
type RemoveImageFunc = func(context.Context, *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error)

// RemoveImageHook intercepts ImageService.RemoveImage.
type RemoveImageHook interface {
	RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest, next RemoveImageFunc) (*runtimeapi.RemoveImageResponse, error)
}

// ListImagesFunc continues a ListImages call.
type ListImagesFunc = func(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error)

// ListImagesHook intercepts ImageService.ListImages. The response of a node
// with many images is large and decoding it costs several times the
// pass-through: implement this only when the response must change.
type ListImagesHook interface {
	ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest, next ListImagesFunc) (*runtimeapi.ListImagesResponse, error)
}

// CreateContainerFunc continues a CreateContainer call.
type CreateContainerFunc = func(context.Context, *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error)

// CreateContainerHook intercepts RuntimeService.CreateContainer.
type CreateContainerHook interface {
	CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next CreateContainerFunc) (*runtimeapi.CreateContainerResponse, error)
}

// RemovePodSandboxFunc continues a RemovePodSandbox call.
type RemovePodSandboxFunc = func(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error)

// RemovePodSandboxHook intercepts RuntimeService.RemovePodSandbox.
type RemovePodSandboxHook interface {
	RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next RemovePodSandboxFunc) (*runtimeapi.RemovePodSandboxResponse, error)
}

// chain composes the hooks of type H around last, outermost first. It
// reports false when no hook is of type H, so the method can stay raw.
func chain[H any, Req, Resp any](
	hooks []any,
	call func(H, context.Context, Req, func(context.Context, Req) (Resp, error)) (Resp, error),
	last func(context.Context, Req) (Resp, error),
) (func(context.Context, Req) (Resp, error), bool) {
	h, used := last, false
	for i := len(hooks) - 1; i >= 0; i-- {
		hook, ok := hooks[i].(H)
		if !ok {
			continue
		}
		next := h
		h = func(ctx context.Context, req Req) (Resp, error) { return call(hook, ctx, req, next) }
		used = true
	}
	return h, used
}
