package criproxy

//go:generate go run ./internal/genmethods methods_gen.go

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Method is a unary CRI method and its request and response types. Every
// one of them has a value in methods_gen.go (PullImage, ImageStatus,
// CreateContainer, ...), generated from the cri-api's service
// descriptions: intercepting any of them needs no change here.
type Method[Req, Resp any] struct {
	FullMethod string // "/runtime.v1.ImageService/PullImage"
}

// Next continues an intercepted call: the next interceptor of the method,
// and finally the runtime.
type Next[Req, Resp any] = func(context.Context, *Req) (*Resp, error)

// Handler intercepts one call. It may change the request, call next any
// number of times (say, once per candidate credential), or answer without
// calling it at all. Errors it returns are mapped to gRPC status codes once,
// at the edge (ToStatus): return the runtime's errors as they are, and wrap
// local ones around the sentinels of github.com/containerd/errdefs.
type Handler[Req, Resp any] = func(ctx context.Context, req *Req, next Next[Req, Resp]) (*Resp, error)

// Interceptor is one handler on one method, made by Intercept. Interceptors
// are given to New in order, outermost first. A method no interceptor is on
// is passed through without decoding, so an interception point costs
// nothing until something uses it.
type Interceptor struct {
	fullMethod string
	handler    any // Handler[Req, Resp]
	filter     any // func(*Req) bool, or nil
	place      placement
	// serve builds the method's handler from every interceptor on it
	// (outermost first), all of the same types as this one.
	serve func(service, name string, on []Interceptor, cc *grpc.ClientConn) grpc.MethodDesc
}

// Intercept puts h on method m. A handler of the wrong type for m does
// not compile.
func Intercept[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method[Req, Resp], h Handler[Req, Resp]) Interceptor {
	return Interceptor{fullMethod: m.FullMethod, handler: h, serve: serveMethod[Req, Resp, PReq, PResp]}
}

// InterceptFiltered is Intercept with a filter that may decline a call from
// its request alone, cheaply: when every interceptor of the method declines,
// the call is forwarded as raw frames and its response never decoded, as
// if nothing intercepted it. An interceptor without a filter wants every
// call. It runs on every call of the method.
func InterceptFiltered[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](m Method[Req, Resp], h Handler[Req, Resp], wants func(*Req) bool) Interceptor {
	i := Intercept[Req, Resp, PReq, PResp](m, h)
	i.filter = wants
	return i
}

// FullMethod is the method the interceptor is on.
func (i Interceptor) FullMethod() string { return i.fullMethod }

// placement is where an interceptor must stand among those on its method.
type placement int

const (
	anywhere  placement = iota
	sole                // the only one given for its method
	innermost           // the last one given for its method
)

func (p placement) String() string {
	return [...]string{"anywhere", "the only interceptor on its method", "the innermost interceptor on its method"}[p]
}

// Sole marks an interceptor that must be the only one given for its
// method: it composes what else the method does itself (ensure's
// PullImage runs credential injection's tries and the registry check of
// each). New refuses a list with another beside it: a chain assembled
// wrongly does not start.
func (i Interceptor) Sole() Interceptor {
	i.place = sole
	return i
}

// Innermost marks an interceptor that must be the last one given for its
// method, next to the runtime (image policy's decision on each try of a
// pull, inside credential injection, which makes the tries). New refuses
// a list with one inside it.
func (i Interceptor) Innermost() Interceptor {
	i.place = innermost
	return i
}

// serveMethod composes the handlers on one method around the call to the
// runtime and serves it, filtered when every interceptor has a filter.
func serveMethod[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](service, name string, on []Interceptor, cc *grpc.ClientConn) grpc.MethodDesc {
	last := invoke[PReq, Resp, PResp](cc, "/"+service+"/"+name)
	h := func(ctx context.Context, req *Req) (*Resp, error) {
		resp, err := last(ctx, PReq(req))
		return (*Resp)(resp), err
	}
	var filters []func(*Req) bool
	filtered := true
	for i := len(on) - 1; i >= 0; i-- {
		handler := on[i].handler.(Handler[Req, Resp])
		next := h
		h = func(ctx context.Context, req *Req) (*Resp, error) { return handler(ctx, req, next) }
		if f, ok := on[i].filter.(func(*Req) bool); ok && f != nil {
			filters = append(filters, f)
		} else {
			filtered = false
		}
	}
	typed := func(ctx context.Context, req PReq) (PResp, error) {
		resp, err := h(ctx, (*Req)(req))
		return PResp(resp), err
	}
	if !filtered {
		return typedMethod(service, name, typed)
	}
	wants := func(req PReq) bool {
		for _, f := range filters {
			if f((*Req)(req)) {
				return true
			}
		}
		return false
	}
	return filteredMethod(service, name, typed, wants, cc)
}

// checkInterceptors refuses an interceptor on a method this build does not
// know as unary (only a Method value of methods_gen.go makes one), and a
// list in which an interceptor is not where it must stand (Sole,
// Innermost).
func checkInterceptors(on []Interceptor) error {
	byMethod := map[string][]int{}
	for n, i := range on {
		if _, ok := unaryMethods[i.fullMethod]; !ok || i.serve == nil {
			return fmt.Errorf("criproxy: cannot intercept %q: not a unary CRI method of this build", i.fullMethod)
		}
		byMethod[i.fullMethod] = append(byMethod[i.fullMethod], n)
	}
	for method, at := range byMethod {
		for k, n := range at {
			switch p := on[n].place; {
			case p == sole && len(at) > 1, p == innermost && k != len(at)-1:
				return fmt.Errorf("criproxy: interceptor %d of %d on %s must be %s, and is not: the chain is assembled wrongly", k+1, len(at), method, p)
			}
		}
	}
	return nil
}
