package criproxy

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime is a small in-process CRI runtime for the unit tests. It
// answers a few methods with fixtures, echoes every method it does not know
// (as a newer runtime would serve methods this build has never seen), and
// reports what it saw of metadata and deadlines in response headers.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	name string // answered as RuntimeName, to tell two runtimes apart

	mu           sync.Mutex
	calls        map[string]int             // full method -> calls seen
	contentTypes map[string]map[string]bool // full method -> content-types its calls came with
	lastPull     *runtimeapi.PullImageRequest
}

// noteContentType records the content-type a call arrived with: a runtime
// may care (CRI-O's socket serves gRPC only for "application/grpc").
func (f *fakeRuntime) noteContentType(ctx context.Context, fullMethod string) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.contentTypes == nil {
		f.contentTypes = make(map[string]map[string]bool)
	}
	if f.contentTypes[fullMethod] == nil {
		f.contentTypes[fullMethod] = make(map[string]bool)
	}
	for _, ct := range md.Get("content-type") {
		f.contentTypes[fullMethod][ct] = true
	}
}

// contentTypesOf returns the content-types calls of fullMethod came with,
// each once, sorted.
func (f *fakeRuntime) contentTypesOf(fullMethod string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.contentTypes[fullMethod]))
}

func (f *fakeRuntime) seen(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[string]int)
	}
	f.calls[method]++
}

func (f *fakeRuntime) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// reportContext sends, as headers, the x-test metadata, the content-type
// and the deadline the runtime saw, and sets a trailer.
func reportContext(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	hdr := metadata.Pairs("x-seen-test", fmt.Sprint(md.Get("x-test")), "x-seen-content-type", fmt.Sprint(md.Get("content-type")))
	if d, ok := ctx.Deadline(); ok {
		hdr.Set("x-seen-deadline-ms", strconv.FormatInt(time.Until(d).Milliseconds(), 10))
	}
	_ = grpc.SetHeader(ctx, hdr)
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-trailer", "from-runtime"))
}

func (f *fakeRuntime) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	f.seen("Version")
	reportContext(ctx)
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: f.name, RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) Status(ctx context.Context, _ *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	f.seen("Status")
	reportContext(ctx)
	st := status.New(codes.FailedPrecondition, "runtime says: not today")
	st, _ = st.WithDetails(&runtimeapi.VersionResponse{RuntimeName: "detail"})
	return nil, st.Err()
}

func (f *fakeRuntime) ImageStatus(ctx context.Context, r *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	f.seen("ImageStatus")
	if r.GetImage().GetImage() == "absent" {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: "sha256:" + f.name, RepoTags: []string{r.GetImage().GetImage()}, Size: 42}}, nil
}

func (f *fakeRuntime) PullImage(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	f.seen("PullImage")
	reportContext(ctx)
	f.mu.Lock()
	f.lastPull = r
	f.mu.Unlock()
	if r.GetImage().GetImage() == "quote-auth" {
		// containerd 1.6 on an auth that decodes to no "user:password".
		a := r.GetAuth()
		dec, _ := base64.StdEncoding.DecodeString(a.GetAuth())
		return nil, status.Errorf(codes.Unknown, "failed to pull and unpack image %q: invalid decoded auth: %q; password %s; token %s/%s",
			r.GetImage().GetImage(), dec, a.GetPassword(), a.GetIdentityToken(), a.GetRegistryToken())
	}
	if r.GetImage().GetImage() == "unavailable" {
		return nil, status.Error(codes.Unavailable, "runtime says: busy")
	}
	if r.GetImage().GetImage() == "slow" {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &runtimeapi.PullImageResponse{ImageRef: "sha256:pulled-" + r.GetImage().GetImage()}, nil
}

func (f *fakeRuntime) ImageFsInfo(ctx context.Context, _ *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	f.seen("ImageFsInfo")
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

func (f *fakeRuntime) RemoveImage(ctx context.Context, r *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	f.seen("RemoveImage")
	if r.GetImage().GetImage() == "unavailable" {
		return nil, status.Error(codes.Unavailable, "runtime says: busy")
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ListImages answers r.Filter.Image.Image images of roughly 1 KiB each when
// that is a number, so tests can ask for any message size.
func (f *fakeRuntime) ListImages(ctx context.Context, r *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	f.seen("ListImages")
	n, _ := strconv.Atoi(r.GetFilter().GetImage().GetImage())
	resp := &runtimeapi.ListImagesResponse{}
	pad := string(make([]byte, 1000))
	for i := 0; i < n; i++ {
		resp.Images = append(resp.Images, &runtimeapi.Image{Id: fmt.Sprintf("sha256:%d", i), RepoTags: []string{pad}, Size: 1})
	}
	return resp, nil
}

func (f *fakeRuntime) CreateContainer(ctx context.Context, r *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	f.seen("CreateContainer")
	return &runtimeapi.CreateContainerResponse{ContainerId: "ctr-" + r.GetConfig().GetImage().GetImage()}, nil
}

func (f *fakeRuntime) RemovePodSandbox(ctx context.Context, r *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.seen("RemovePodSandbox")
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// GetContainerEvents sends three events, then ends with the status the
// client asked for (none: OK).
func (f *fakeRuntime) GetContainerEvents(r *runtimeapi.GetEventsRequest, ss runtimeapi.RuntimeService_GetContainerEventsServer) error {
	f.seen("GetContainerEvents")
	reportContext(ss.Context())
	for i := 0; i < 3; i++ {
		if err := ss.Send(&runtimeapi.ContainerEventResponse{ContainerId: fmt.Sprint("c", i)}); err != nil {
			return err
		}
	}
	return status.Error(codes.Aborted, "events end here")
}

// echo serves every method the fake does not implement by sending each
// message back, whatever the method's kind.
func (f *fakeRuntime) echo(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	f.seen(method)
	reportContext(ss.Context())
	if strings.HasSuffix(method, "Unavailable") {
		return status.Error(codes.Unavailable, "runtime says: busy")
	}
	for {
		m := new(frame)
		if err := ss.RecvMsg(m); err != nil {
			return nil
		}
		if err := ss.SendMsg(m); err != nil {
			return err
		}
	}
}

// shortTempDir returns a fresh directory with a path short enough for unix
// sockets (108 bytes), removed at the end of the test.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// newFakeRuntimeServer returns a gRPC server of f, not yet serving.
func newFakeRuntimeServer(f *fakeRuntime) *grpc.Server {
	srv := grpc.NewServer(
		grpc.ForceServerCodecV2(codec{}),
		grpc.UnknownServiceHandler(f.echo),
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			f.noteContentType(ctx, info.FullMethod)
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			f.noteContentType(ss.Context(), info.FullMethod)
			return handler(srv, ss)
		}),
	)
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	runtimeapi.RegisterImageServiceServer(srv, f)
	return srv
}

// startFakeRuntime serves f on path until the test ends or stop is called.
func startFakeRuntime(t testing.TB, f *fakeRuntime, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := newFakeRuntimeServer(f)
	go srv.Serve(l)
	var once sync.Once
	stop = func() { once.Do(srv.Stop) }
	t.Cleanup(stop)
	return stop
}

// proxyRig is a proxy in front of one or two fake runtimes, and a client.
type proxyRig struct {
	runtime, image *fakeRuntime
	runtimeSock    string
	stopRuntime    func()
	backend        *Backend
	server         *Server
	conn           *grpc.ClientConn
	rt             runtimeapi.RuntimeServiceClient
	img            runtimeapi.ImageServiceClient
	direct         runtimeapi.RuntimeServiceClient // the runtime without the proxy
	directConn     *grpc.ClientConn
	sock           string // the proxy's
}

// newProxyRig starts a fake runtime, a proxy with opts in front of it and a
// client of the proxy. With separateImage the ImageService is a second fake.
func newProxyRig(t testing.TB, opts Options, separateImage bool) *proxyRig {
	t.Helper()
	dir := shortTempDir(t)
	runtime, runtimeSock := &fakeRuntime{name: "runtime"}, filepath.Join(dir, "rt.sock")
	stopRuntime := startFakeRuntime(t, runtime, runtimeSock)
	imageEndpoint := ""
	image := runtime
	if separateImage {
		image = &fakeRuntime{name: "image"}
		imageSock := filepath.Join(dir, "img.sock")
		startFakeRuntime(t, image, imageSock)
		imageEndpoint = "unix://" + imageSock
	}
	r := startProxyRig(t, opts, runtimeSock, imageEndpoint)
	r.runtime, r.image, r.stopRuntime = runtime, image, stopRuntime
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
