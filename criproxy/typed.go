package criproxy

import (
	"context"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// typedServices builds the service descriptions of the intercepted methods
// that at least one hook implements. All other methods, including the rest
// of these two services, reach the pass-through handler: gRPC falls back to
// the unknown-service handler for a known service's unknown method.
func (s *Server) typedServices() []*grpc.ServiceDesc {
	images := &grpc.ServiceDesc{ServiceName: runtimeapi.ImageService_ServiceDesc.ServiceName, HandlerType: (*any)(nil)}
	runtime := &grpc.ServiceDesc{ServiceName: runtimeapi.RuntimeService_ServiceDesc.ServiceName, HandlerType: (*any)(nil)}
	add := func(sd *grpc.ServiceDesc, md grpc.MethodDesc, used bool) {
		if used {
			sd.Methods = append(sd.Methods, md)
		}
	}
	img, rt := s.backend.Image, s.backend.Runtime

	h1, ok := chain(s.hooks, PullImageHook.PullImage, invoke[*runtimeapi.PullImageRequest, runtimeapi.PullImageResponse](img, runtimeapi.ImageService_PullImage_FullMethodName))
	add(images, typedMethod(images.ServiceName, "PullImage", h1), ok)
	h2, ok := chain(s.hooks, ImageStatusHook.ImageStatus, invoke[*runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse](img, runtimeapi.ImageService_ImageStatus_FullMethodName))
	add(images, typedMethod(images.ServiceName, "ImageStatus", h2), ok)
	h3, ok := chain(s.hooks, RemoveImageHook.RemoveImage, invoke[*runtimeapi.RemoveImageRequest, runtimeapi.RemoveImageResponse](img, runtimeapi.ImageService_RemoveImage_FullMethodName))
	add(images, typedMethod(images.ServiceName, "RemoveImage", h3), ok)
	h4, ok := chain(s.hooks, ListImagesHook.ListImages, invoke[*runtimeapi.ListImagesRequest, runtimeapi.ListImagesResponse](img, runtimeapi.ImageService_ListImages_FullMethodName))
	add(images, typedMethod(images.ServiceName, "ListImages", h4), ok)
	h5, ok := chain(s.hooks, CreateContainerHook.CreateContainer, invoke[*runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse](rt, runtimeapi.RuntimeService_CreateContainer_FullMethodName))
	add(runtime, typedMethod(runtime.ServiceName, "CreateContainer", h5), ok)
	h6, ok := chain(s.hooks, RemovePodSandboxHook.RemovePodSandbox, invoke[*runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse](rt, runtimeapi.RuntimeService_RemovePodSandbox_FullMethodName))
	add(runtime, typedMethod(runtime.ServiceName, "RemovePodSandbox", h6), ok)

	var out []*grpc.ServiceDesc
	for _, sd := range []*grpc.ServiceDesc{images, runtime} {
		if len(sd.Methods) > 0 {
			out = append(out, sd)
		}
	}
	return out
}

// typedMethod serves one intercepted unary method: it decodes the request,
// runs the hook chain h and maps a local error to a gRPC status, once.
func typedMethod[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](service, name string, h func(context.Context, PReq) (Resp, error)) grpc.MethodDesc {
	info := &grpc.UnaryServerInfo{FullMethod: "/" + service + "/" + name}
	run := func(ctx context.Context, req PReq) (any, error) {
		resp, err := h(outgoingContext(ctx), req)
		if err != nil {
			return nil, ToStatus(err)
		}
		return resp, nil
	}
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := PReq(new(Req))
			if err := dec(req); err != nil {
				return nil, err
			}
			if interceptor == nil {
				return run(ctx, req)
			}
			return interceptor(ctx, req, info, func(ctx context.Context, r any) (any, error) {
				return run(ctx, r.(PReq))
			})
		},
	}
}

// invoke returns the end of a hook chain: the call to the runtime. The
// runtime's headers and trailers are passed on to the caller; when a hook
// calls the runtime more than once, the last call's metadata wins.
func invoke[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](cc *grpc.ClientConn, fullMethod string) func(context.Context, Req) (PResp, error) {
	return func(ctx context.Context, req Req) (PResp, error) {
		resp := PResp(new(Resp))
		var header, trailer metadata.MD
		err := cc.Invoke(ctx, fullMethod, req, resp, grpc.Header(&header), grpc.Trailer(&trailer))
		if len(header) > 0 {
			_ = grpc.SetHeader(ctx, header) // fails only once headers went out; then they are moot
		}
		if len(trailer) > 0 {
			_ = grpc.SetTrailer(ctx, trailer)
		}
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
}

// ToStatus maps an error to a gRPC status, once, at the edge. An error that
// already carries a status (the runtime's answer, possibly wrapped) keeps its
// code; errdefs sentinels and context errors get theirs; anything else is
// Unknown, as containerd itself answers.
func ToStatus(err error) error {
	return errgrpc.ToGRPC(err)
}
