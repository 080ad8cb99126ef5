package criproxy

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// proxyRig is a proxy in front of one or two fake runtimes, and a client.
type proxyRig struct {
	runtime, image *fakecri.Runtime
	runtimeSock    string
	backend        *Backend
	server         *Server
	conn           *grpc.ClientConn
	rt             runtimeapi.RuntimeServiceClient
	img            runtimeapi.ImageServiceClient
	direct         runtimeapi.RuntimeServiceClient // the runtime without the proxy
	directConn     *grpc.ClientConn
	sock           string // the proxy's
}

// newProxyRig starts a fake runtime named "runtime", a proxy with opts in
// front of it and a client of the proxy. With separateImage the
// ImageService is a second fake, named "image".
func newProxyRig(t testing.TB, opts Options, separateImage bool) *proxyRig {
	t.Helper()
	dir := fakecri.SocketDir(t)
	runtime, runtimeSock := fakecri.New("runtime"), filepath.Join(dir, "rt.sock")
	runtime.Serve(t, runtimeSock)
	imageEndpoint := ""
	image := runtime
	if separateImage {
		image = fakecri.New("image")
		imageSock := filepath.Join(dir, "img.sock")
		image.Serve(t, imageSock)
		imageEndpoint = "unix://" + imageSock
	}
	r := startProxyRig(t, opts, runtimeSock, imageEndpoint)
	r.runtime, r.image = runtime, image
	return r
}

// startProxyRig starts a proxy with opts in front of the runtime at
// runtimeSock (and imageEndpoint, if not empty), a client of the proxy and
// one of the runtime itself. The caller fills in the runtimes.
func startProxyRig(t testing.TB, opts Options, runtimeSock, imageEndpoint string) *proxyRig {
	t.Helper()
	r := &proxyRig{runtimeSock: runtimeSock}
	backend, err := Dial("unix://"+runtimeSock, imageEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	r.backend = backend
	if r.server, err = New(backend, opts); err != nil {
		t.Fatal(err)
	}
	proxySock := filepath.Join(filepath.Dir(runtimeSock), "proxy.sock")
	r.sock = proxySock
	l, err := net.Listen("unix", proxySock)
	if err != nil {
		t.Fatal(err)
	}
	go r.server.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.server.Shutdown(ctx)
	})
	r.conn, err = grpc.NewClient("unix://"+proxySock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.conn.Close() })
	r.rt = runtimeapi.NewRuntimeServiceClient(r.conn)
	direct, err := grpc.NewClient("unix://"+runtimeSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	r.direct = runtimeapi.NewRuntimeServiceClient(direct)
	r.directConn = direct
	r.img = runtimeapi.NewImageServiceClient(r.conn)
	return r
}

// notToday is an error of the runtime's with a code, a message and a
// detail, each of which must reach the client as the runtime said it.
func notToday() error {
	st, err := status.New(codes.FailedPrecondition, "runtime says: not today").WithDetails(&runtimeapi.VersionResponse{RuntimeName: "detail"})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// busy is a runtime's own Unavailable, which is no sign that it is away.
var busy = status.Error(codes.Unavailable, "runtime says: busy")

// aSecondLong makes a pull take a second, unless its call ends first.
func aSecondLong(ctx context.Context, _ *runtimeapi.PullImageRequest) error {
	select {
	case <-time.After(time.Second):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
