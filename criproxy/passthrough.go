package criproxy

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// passThrough is the handler for every method that is not intercepted. It
// forwards frames without decoding them; status codes, messages, details,
// headers, trailers and the deadline arrive unchanged.
func (s *Server) passThrough(_ any, ss grpc.ServerStream) error {
	fullMethod, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "cri-image-proxy: no method name in the server stream")
	}
	cc := s.backend.conn(fullMethod)
	if isUnary(fullMethod) {
		return forwardUnaryFrame(ss, cc, fullMethod)
	}
	return forwardStream(ss, cc, fullMethod)
}

// forwardUnaryFrame is the fast path for unary calls: one RecvMsg, one
// Invoke, one SendMsg. It is measurably cheaper than pumping a generic stream.
func forwardUnaryFrame(ss grpc.ServerStream, cc *grpc.ClientConn, fullMethod string) error {
	in := new(frame)
	if err := ss.RecvMsg(in); err != nil {
		return err
	}
	var header, trailer metadata.MD
	out := new(frame)
	err := cc.Invoke(outgoingContext(ss.Context()), fullMethod, in, out,
		grpc.ForceCodecV2(clientCodec{}), grpc.Header(&header), grpc.Trailer(&trailer))
	if err != nil {
		in.free()
	}
	if hasCustomKeys(header) {
		if herr := ss.SetHeader(header); herr != nil {
			out.free()
			return herr
		}
	}
	setTrailer(ss, trailer)
	if err != nil {
		return err
	}
	return ss.SendMsg(out)
}

// setTrailer passes the runtime's trailer on. A trailers-only answer (an
// error) brings its content-type along, which is not ours to repeat.
func setTrailer(ss grpc.ServerStream, trailer metadata.MD) {
	if !hasCustomKeys(trailer) {
		return
	}
	ss.SetTrailer(withoutContentType(trailer))
}

// withoutContentType returns md without its content-type, copying only
// when it has one.
func withoutContentType(md metadata.MD) metadata.MD {
	if _, ok := md["content-type"]; !ok {
		return md
	}
	md = md.Copy()
	delete(md, "content-type")
	return md
}

// hasCustomKeys reports whether md has a key gRPC would not set by itself.
// Most runtimes send none, and skipping the copy saves work on every call.
func hasCustomKeys(md metadata.MD) bool {
	for k := range md {
		if k != "content-type" {
			return true
		}
	}
	return false
}

// forwardStream pumps frames both ways for streaming calls and for methods
// this build does not know, whatever their kind.
func forwardStream(ss grpc.ServerStream, cc *grpc.ClientConn, fullMethod string) error {
	ctx, cancel := context.WithCancel(outgoingContext(ss.Context()))
	defer cancel()
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	cs, err := cc.NewStream(ctx, desc, fullMethod, grpc.ForceCodecV2(clientCodec{}))
	if err != nil {
		return err
	}

	// Client to runtime, in the background. EOF half-closes the runtime
	// stream. Any other error is the client going away, which cancels the
	// server context and with it the runtime call, so the loop below sees it.
	go func() {
		for {
			f := new(frame)
			if err := ss.RecvMsg(f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend() // never fails for a client stream
				}
				return
			}
			if err := cs.SendMsg(f); err != nil {
				// The runtime ended the call; its status comes from RecvMsg below.
				f.free()
				return
			}
		}
	}()

	// Runtime to client, in the foreground: the runtime's status ends the call.
	headerSent := false
	for {
		f := new(frame)
		err := cs.RecvMsg(f)
		if !headerSent {
			headerSent = true
			// Headers precede any message, so they are here now; after an
			// early error Header returns whatever arrived.
			if md, herr := cs.Header(); herr == nil && len(md) > 0 {
				if serr := ss.SendHeader(md); serr != nil {
					f.free()
					return serr
				}
			}
		}
		if err != nil {
			setTrailer(ss, cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(f); err != nil {
			return err
		}
	}
}

// outgoingContext carries the caller's metadata on to the runtime. The
// deadline and cancellation come with ctx itself. gRPC drops the reserved
// headers (":authority", "content-type", "user-agent", "grpc-*").
func outgoingContext(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	return metadata.NewOutgoingContext(ctx, md)
}
