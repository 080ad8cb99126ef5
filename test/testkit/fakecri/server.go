package fakecri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxMessage is above the CRI's 16 MiB, so that the limit a test meets
// is the proxy's or its client's, never the runtime's.
const maxMessage = 64 << 20

// Server returns a gRPC server of r, not yet serving: for a listener of
// the test's own (a socket served as CRI-O serves it), or a child process
// that stops it gracefully.
func (r *Runtime) Server() *grpc.Server {
	srv := grpc.NewServer(
		grpc.ForceServerCodecV2(codec{}),
		grpc.UnknownServiceHandler(echo),
		grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := r.arrive(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		// Streams, and every method of echo: gRPC runs stream interceptors
		// around the unknown service handler too.
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := r.arrive(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	)
	runtimeapi.RegisterRuntimeServiceServer(srv, r)
	runtimeapi.RegisterImageServiceServer(srv, r)
	return srv
}

// Serve serves r on a unix socket at path until the test ends.
func (r *Runtime) Serve(t testing.TB, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := r.Server()
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
}

// SocketDir returns a new directory with a path short enough for unix
// sockets (at most 107 bytes: t.TempDir's, named after the test, can be
// longer), removed when the test ends.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// report sends back, as headers, what the call brought, and sets a
// trailer: what reached the runtime, for the test to read on its side.
func report(ctx context.Context) {
	hdr := metadata.Pairs("x-seen-test", fmt.Sprint(incoming(ctx, "x-test")), "x-seen-content-type", fmt.Sprint(incoming(ctx, "content-type")))
	if d, ok := ctx.Deadline(); ok {
		hdr.Set("x-seen-deadline-ms", strconv.FormatInt(time.Until(d).Milliseconds(), 10))
	}
	_ = grpc.SetHeader(ctx, hdr)
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "from-runtime"))
}

// incoming returns the values of the call's metadata key.
func incoming(ctx context.Context, key string) []string {
	md, _ := metadata.FromIncomingContext(ctx)
	return md.Get(key)
}

// echo serves every method the runtime does not know by sending each
// message back as it came, whatever the method's kind.
func echo(_ any, ss grpc.ServerStream) error {
	for {
		var f frame
		if err := ss.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

// frame is a message as it travels, undecoded: what echo sends back.
type frame []byte

// codec is gRPC's own, except that a frame passes as its bytes.
type codec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		return mem.BufferSlice{mem.SliceBuffer(*f)}, nil
	}
	return protoCodec.Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		*f = data.Materialize()
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

func (codec) Name() string { return proto.Name }
