package criproxy

import (
	"context"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// typedServices builds the service descriptions of the intercepted
// methods, one method per group of interceptors on it. All other methods,
// including the rest of these services, reach the pass-through handler:
// gRPC falls back to the unknown-service handler for a known service's
// unknown method.
func (s *Server) typedServices() []*grpc.ServiceDesc {
	byMethod := map[string][]Interceptor{}
	var order []string
	for _, i := range s.interceptors {
		if _, seen := byMethod[i.fullMethod]; !seen {
			order = append(order, i.fullMethod)
		}
		byMethod[i.fullMethod] = append(byMethod[i.fullMethod], i)
	}
	services := map[string]*grpc.ServiceDesc{}
	var out []*grpc.ServiceDesc
	for _, fullMethod := range order {
		on := byMethod[fullMethod]
		service, name := splitMethod(fullMethod)
		cc := s.backend.Runtime
		if service == runtimeapi.ImageService_ServiceDesc.ServiceName {
			cc = s.backend.Image
		}
		sd := services[service]
		if sd == nil {
			sd = &grpc.ServiceDesc{ServiceName: service, HandlerType: (*any)(nil)}
			services[service] = sd
			out = append(out, sd)
		}
		sd.Methods = append(sd.Methods, on[0].serve(service, name, on, cc))
	}
	return out
}

// typedMethod serves one intercepted unary method: it decodes the request,
// runs the hook chain h and maps a local error to a gRPC status, once.
func typedMethod[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](service, name string, h func(context.Context, PReq) (Resp, error)) grpc.MethodDesc {
	serve := typedServe(service, name, h)
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in, req, err := decodeFrame[Req, PReq](name, dec)
			if err != nil {
				return nil, err
			}
			in.free()
			return serve(ctx, req, interceptor)
		},
	}
}

// typedServe runs the hook chain h on a decoded request, through the
// interceptor, mapping a local error to a gRPC status.
func typedServe[PReq proto.Message, Resp proto.Message](service, name string, h func(context.Context, PReq) (Resp, error)) func(context.Context, PReq, grpc.UnaryServerInterceptor) (any, error) {
	info := &grpc.UnaryServerInfo{FullMethod: "/" + service + "/" + name}
	run := func(ctx context.Context, req PReq) (any, error) {
		resp, err := h(outgoingContext(ctx), req)
		if err != nil {
			return nil, ToStatus(err)
		}
		return resp, nil
	}
	return func(ctx context.Context, req PReq, interceptor grpc.UnaryServerInterceptor) (any, error) {
		if interceptor == nil {
			return run(ctx, req)
		}
		return interceptor(ctx, req, info, func(ctx context.Context, r any) (any, error) {
			return run(ctx, r.(PReq))
		})
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

// filteredMethod is typedMethod for a method whose hooks may decline a call
// from its request alone: a declined call is forwarded as raw frames, the
// request as it came and the response undecoded. Without a filter it is
// typedMethod.
func filteredMethod[Req any, PReq interface {
	*Req
	proto.Message
}, Resp proto.Message](service, name string, h func(context.Context, PReq) (Resp, error), wants func(PReq) bool, cc *grpc.ClientConn) grpc.MethodDesc {
	if wants == nil {
		return typedMethod(service, name, h)
	}
	serve := typedServe(service, name, h)
	fullMethod := "/" + service + "/" + name
	info := &grpc.UnaryServerInfo{FullMethod: fullMethod}
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in, req, err := decodeFrame[Req, PReq](name, dec)
			if err != nil {
				return nil, err
			}
			if wants(req) {
				in.free()
				return serve(ctx, req, interceptor)
			}
			forward := func(ctx context.Context, _ any) (any, error) {
				var header, trailer metadata.MD
				out := new(frame)
				err := cc.Invoke(outgoingContext(ctx), fullMethod, in, out, grpc.ForceCodecV2(clientCodec{}), grpc.Header(&header), grpc.Trailer(&trailer))
				if hasCustomKeys(header) {
					_ = grpc.SetHeader(ctx, header)
				}
				if hasCustomKeys(trailer) {
					_ = grpc.SetTrailer(ctx, withoutContentType(trailer))
				}
				if err != nil {
					return nil, err
				}
				return out, nil
			}
			if interceptor == nil {
				return forward(ctx, req)
			}
			return interceptor(ctx, req, info, forward)
		},
	}
}

// decodeFrame reads a request's frame with dec and decodes it into a new
// request, returning both: the caller frees the frame once it no longer
// forwards it as it came. The frame is decoded here, not by gRPC: gRPC
// answers a request it cannot decode (invalid UTF-8 in a string field, a
// truncated message) with Internal, written before the handler could say
// otherwise. It is the caller's mistake: InvalidArgument, the same on every
// intercepted method, filtered or not.
func decodeFrame[Req any, PReq interface {
	*Req
	proto.Message
}](name string, dec func(any) error) (*frame, PReq, error) {
	in := new(frame)
	if err := dec(in); err != nil {
		return nil, nil, err
	}
	req := PReq(new(Req))
	if err := proto.Unmarshal(contiguous(in.data), req); err != nil {
		in.free()
		return nil, nil, status.Errorf(codes.InvalidArgument, "decode %s request: %v", name, err)
	}
	return in, req, nil
}

// contiguous returns the bytes of data, copying only when they are split
// over several buffers (small requests never are).
func contiguous(data mem.BufferSlice) []byte {
	if len(data) == 1 {
		return data[0].ReadOnlyData()
	}
	return data.Materialize()
}
