package criproxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/test/testkit/fakecri"
)

// recorder is a hook on all six interception points. It notes each call
// under its name, tags requests so the runtime's answer proves the request
// went through the hook, and otherwise forwards.
type recorder struct {
	name string
	mu   sync.Mutex
	log  *[]string
}

func (r *recorder) note(method string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.log = append(*r.log, r.name+":"+method)
}

func (r *recorder) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	r.note("PullImage")
	req.Image.Image += "+" + r.name
	return next(ctx, req)
}

func (r *recorder) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, next Next[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse]) (*runtimeapi.ImageStatusResponse, error) {
	r.note("ImageStatus")
	return next(ctx, req)
}

func (r *recorder) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest, next Next[runtimeapi.RemoveImageRequest, runtimeapi.RemoveImageResponse]) (*runtimeapi.RemoveImageResponse, error) {
	r.note("RemoveImage")
	return next(ctx, req)
}

func (r *recorder) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest, next Next[runtimeapi.ListImagesRequest, runtimeapi.ListImagesResponse]) (*runtimeapi.ListImagesResponse, error) {
	r.note("ListImages")
	return next(ctx, req)
}

func (r *recorder) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest, next Next[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	r.note("CreateContainer")
	return next(ctx, req)
}

func (r *recorder) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest, next Next[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.note("RemovePodSandbox")
	return next(ctx, req)
}

// interceptors puts the recorder on its six methods.
func (r *recorder) interceptors() []Interceptor {
	return []Interceptor{
		Intercept(PullImage, r.PullImage), Intercept(ImageStatus, r.ImageStatus), Intercept(RemoveImage, r.RemoveImage),
		Intercept(ListImages, r.ListImages), Intercept(CreateContainer, r.CreateContainer), Intercept(RemovePodSandbox, r.RemovePodSandbox),
	}
}

func TestInterceptorsOnSixMethods(t *testing.T) {
	t.Parallel()
	var log []string
	outer, inner := &recorder{name: "outer", log: &log}, &recorder{name: "inner", log: &log}
	rig := newProxyRig(t, Options{Interceptors: append(outer.interceptors(), inner.interceptors()...)}, false)
	ctx := context.Background()

	pull, err := rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "app"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "sha256:pulled-app+outer+inner"; pull.ImageRef != want {
		t.Errorf("PullImage ref = %q, want %q: the hooks' changes reach the runtime in order", pull.ImageRef, want)
	}
	if _, err := rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: "app"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rig.img.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: "app"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rig.img.ListImages(ctx, &runtimeapi.ListImagesRequest{}); err != nil {
		t.Fatal(err)
	}
	cc, err := rig.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: "app"}}})
	if err != nil || cc.ContainerId != "ctr-app" {
		t.Fatalf("CreateContainer = %v, %v", cc, err)
	}
	if _, err := rig.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: "p"}); err != nil {
		t.Fatal(err)
	}
	// Not an interception point: passes through untouched.
	if _, err := rig.rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}

	var want []string
	for _, m := range []string{"PullImage", "ImageStatus", "RemoveImage", "ListImages", "CreateContainer", "RemovePodSandbox"} {
		want = append(want, "outer:"+m, "inner:"+m)
		if rig.runtime.Calls(m) != 1 {
			t.Errorf("the runtime saw %s %d times, want 1", m, rig.runtime.Calls(m))
		}
	}
	if diff := cmp.Diff(want, log); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
}

// onlyPull intercepts PullImage alone, answering itself for some images
// and failing for others.
type onlyPull struct{}

func (onlyPull) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest, next Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
	switch req.GetImage().GetImage() {
	case "answer-locally":
		return &runtimeapi.PullImageResponse{ImageRef: "sha256:local"}, nil
	case "denied":
		return nil, fmt.Errorf("image %q for pod %q: %w", "denied", "p", errdefs.ErrPermissionDenied)
	case "broken":
		return nil, fmt.Errorf("record store: disk on fire")
	}
	return next(ctx, req)
}

func TestHookAnswersAndErrors(t *testing.T) {
	t.Parallel()
	rig := newProxyRig(t, Options{Interceptors: []Interceptor{Intercept(PullImage, onlyPull{}.PullImage)}}, false)
	ctx := context.Background()

	for _, tc := range []struct {
		name        string
		image       string
		wantRef     string
		wantCode    codes.Code
		wantMessage string
		wantPulls   int
	}{
		{name: "a hook may answer without the runtime", image: "answer-locally", wantRef: "sha256:local"},
		{name: "a hook's errdefs error becomes its gRPC code, message intact", image: "denied", wantCode: codes.PermissionDenied,
			wantMessage: `image "denied" for pod "p": permission denied`},
		{name: "any other hook error is Unknown, as containerd answers", image: "broken", wantCode: codes.Unknown,
			wantMessage: "record store: disk on fire"},
		{name: "the runtime's answer passes through the hook", image: "app", wantRef: "sha256:pulled-app", wantPulls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := rig.runtime.Calls("PullImage")
			resp, err := pullImage(rig, ctx, tc.image)
			if st := status.Convert(err); st.Code() != tc.wantCode || (tc.wantMessage != "" && st.Message() != tc.wantMessage) {
				t.Fatalf("got %v, want %v %q", err, tc.wantCode, tc.wantMessage)
			}
			if resp.GetImageRef() != tc.wantRef {
				t.Errorf("ref = %q, want %q", resp.GetImageRef(), tc.wantRef)
			}
			if got := rig.runtime.Calls("PullImage") - before; got != tc.wantPulls {
				t.Errorf("runtime pulls = %d, want %d", got, tc.wantPulls)
			}
		})
	}

	t.Run("only the methods a hook implements are decoded", func(t *testing.T) {
		sds := rig.server.typedServices()
		if len(sds) != 1 || len(sds[0].Methods) != 1 || sds[0].Methods[0].MethodName != "PullImage" {
			t.Errorf("typed services = %+v, want ImageService/PullImage alone", sds)
		}
	})

	t.Run("the typed path carries metadata both ways", func(t *testing.T) {
		var header, trailer metadata.MD
		ctx := metadata.AppendToOutgoingContext(ctx, "x-test", "typed")
		if _, err := pullImage(rig, ctx, "app", grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			t.Fatal(err)
		}
		if got := header.Get("x-seen-test"); len(got) != 1 || got[0] != "[typed]" {
			t.Errorf("runtime saw x-test = %v, want [typed]", got)
		}
		if got := trailer.Get("x-trailer"); len(got) != 1 || got[0] != "from-runtime" {
			t.Errorf("trailer x-trailer = %v, want from-runtime", got)
		}
	})
}

func pullImage(rig *proxyRig, ctx context.Context, image string, opts ...grpc.CallOption) (*runtimeapi.PullImageResponse, error) {
	return rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}, opts...)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	rig := newProxyRig(t, Options{Registerer: reg, Interceptors: []Interceptor{Intercept(PullImage, onlyPull{}.PullImage)}}, false)
	rig.runtime.Fail("Status", notToday())
	ctx := context.Background()
	rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
	rig.rt.Version(ctx, &runtimeapi.VersionRequest{})
	rig.rt.Status(ctx, &runtimeapi.StatusRequest{})
	rig.img.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "denied"}})
	rig.conn.Invoke(ctx, "/secret.v1.Name/WithTokenInIt", &runtimeapi.VersionRequest{}, new(runtimeapi.VersionResponse))

	m := rig.server.metrics
	for _, tc := range []struct {
		name                  string
		service, method, code string
		want                  float64
	}{
		{"pass-through calls are counted by method and code", "runtime.v1.RuntimeService", "Version", "OK", 2},
		{"runtime errors are counted under their code", "runtime.v1.RuntimeService", "Status", "FailedPrecondition", 1},
		{"hook errors are counted under their mapped code", "runtime.v1.ImageService", "PullImage", "PermissionDenied", 1},
		{"methods this build does not know share one label", "unknown", "unknown", "OK", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := testutil.ToFloat64(m.requests.WithLabelValues(tc.service, tc.method, tc.code)); got != tc.want {
				t.Errorf("requests_total = %v, want %v", got, tc.want)
			}
		})
	}
	// Only unary calls are timed; an unknown method may be a stream.
	if n := testutil.CollectAndCount(m.duration); n != 3 {
		t.Errorf("duration series = %d, want 3 (Version, Status, PullImage)", n)
	}
}

// picky hooks ImageStatus but declines images named "skip-*".
type picky struct{ calls atomic.Int32 }

func (p *picky) WantsImageStatus(req *runtimeapi.ImageStatusRequest) bool {
	return !strings.HasPrefix(req.GetImage().GetImage(), "skip-")
}

func (p *picky) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest, next Next[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse]) (*runtimeapi.ImageStatusResponse, error) {
	p.calls.Add(1)
	return next(ctx, req)
}

func TestImageStatusFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	status := func(rig *proxyRig, image string) (*runtimeapi.ImageStatusResponse, error) {
		return rig.img.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	}

	t.Run("a declined call reaches the runtime without the hook, answer intact", func(t *testing.T) {
		h := &picky{}
		rig := newProxyRig(t, Options{Interceptors: []Interceptor{InterceptFiltered(ImageStatus, h.ImageStatus, h.WantsImageStatus)}}, false)
		rig.runtime.Put(fakecri.Image("sha256:runtime", "skip-me"))
		resp, err := status(rig, "skip-me")
		if err != nil || resp.GetImage().GetId() != "sha256:runtime" || resp.GetImage().GetRepoTags()[0] != "skip-me" {
			t.Fatalf("got %v, %v", resp, err)
		}
		if h.calls.Load() != 0 {
			t.Errorf("the hook ran for a declined call")
		}
		if _, err := status(rig, "wanted"); err != nil || h.calls.Load() != 1 {
			t.Errorf("a wanted call: %v, hook calls %d", err, h.calls.Load())
		}
		if rig.runtime.Calls("ImageStatus") != 2 {
			t.Errorf("runtime saw %d calls", rig.runtime.Calls("ImageStatus"))
		}
	})

	t.Run("a hook that cannot decline gets every call", func(t *testing.T) {
		h := &picky{}
		var log []string
		rig := newProxyRig(t, Options{Interceptors: []Interceptor{InterceptFiltered(ImageStatus, h.ImageStatus, h.WantsImageStatus), Intercept(ImageStatus, (&recorder{name: "r", log: &log}).ImageStatus)}}, false)
		if _, err := status(rig, "skip-me"); err != nil {
			t.Fatal(err)
		}
		if len(log) != 1 || h.calls.Load() != 1 {
			t.Errorf("recorder %v, picky %d: both must run when one cannot decline", log, h.calls.Load())
		}
	})
}

func TestAnyUnaryMethodCanBeIntercepted(t *testing.T) {
	t.Parallel()
	// Version was never an interception point: its Method value is
	// generated from the cri-api like every other one.
	var calls atomic.Int32
	version := func(ctx context.Context, req *runtimeapi.VersionRequest, next Next[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		calls.Add(1)
		resp, err := next(ctx, req)
		if err == nil {
			resp.RuntimeName += "+intercepted"
		}
		return resp, err
	}
	rig := newProxyRig(t, Options{Interceptors: []Interceptor{Intercept(Version, version)}}, false)
	resp, err := rig.rt.Version(context.Background(), &runtimeapi.VersionRequest{})
	if err != nil || calls.Load() != 1 || !strings.HasSuffix(resp.GetRuntimeName(), "+intercepted") {
		t.Errorf("Version = %v, %v; the interceptor ran %d times", resp, err, calls.Load())
	}
	if n := len(unaryMethods); n < 30 {
		t.Errorf("only %d unary CRI methods were generated", n)
	}
}

func TestAnInterceptorOnAMethodThatIsNotACRIMethodIsRefused(t *testing.T) {
	t.Parallel()
	forged := Method[runtimeapi.VersionRequest, runtimeapi.VersionResponse]{FullMethod: "/runtime.v1.RuntimeService/NoSuchMethod"}
	_, err := New(&Backend{}, Options{Interceptors: []Interceptor{Intercept(forged, func(ctx context.Context, req *runtimeapi.VersionRequest, next Next[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		return next(ctx, req)
	})}})
	if err == nil || !strings.Contains(err.Error(), "NoSuchMethod") {
		t.Errorf("got %v", err)
	}
}

// TestAChainAssembledWronglyDoesNotStart: an interceptor marked Sole with
// another on its method, or one marked Innermost with one inside it, is
// refused by New, naming the method: the proxy does not start.
func TestAChainAssembledWronglyDoesNotStart(t *testing.T) {
	t.Parallel()
	pass := func(ctx context.Context, req *runtimeapi.PullImageRequest, next Next[runtimeapi.PullImageRequest, runtimeapi.PullImageResponse]) (*runtimeapi.PullImageResponse, error) {
		return next(ctx, req)
	}
	status := func(ctx context.Context, req *runtimeapi.ImageStatusRequest, next Next[runtimeapi.ImageStatusRequest, runtimeapi.ImageStatusResponse]) (*runtimeapi.ImageStatusResponse, error) {
		return next(ctx, req)
	}
	for _, tc := range []struct {
		name string
		on   []Interceptor
		ok   bool
	}{
		{"a sole interceptor alone on its method starts", []Interceptor{Intercept(PullImage, pass).Sole(), Intercept(ImageStatus, status)}, true},
		{"a sole interceptor with another on its method is refused", []Interceptor{Intercept(PullImage, pass).Sole(), Intercept(PullImage, pass)}, false},
		{"a sole interceptor with another outside it is refused", []Interceptor{Intercept(PullImage, pass), Intercept(PullImage, pass).Sole()}, false},
		{"an innermost interceptor last on its method starts", []Interceptor{Intercept(PullImage, pass), Intercept(PullImage, pass).Innermost()}, true},
		{"an innermost interceptor with one inside it is refused", []Interceptor{Intercept(PullImage, pass).Innermost(), Intercept(PullImage, pass)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(&Backend{}, Options{Interceptors: tc.on})
			if tc.ok && err != nil || !tc.ok && (err == nil || !strings.Contains(err.Error(), "PullImage") || !strings.Contains(err.Error(), "assembled wrongly")) {
				t.Errorf("got %v", err)
			}
		})
	}
}

func TestGeneratedMethodsAreUpToDate(t *testing.T) {
	t.Parallel()
	// Regenerating from this build's cri-api changes nothing (run go
	// generate ./criproxy after updating k8s.io/cri-api).
	out := filepath.Join(t.TempDir(), "methods_gen.go")
	cmd := exec.Command("go", "run", "./internal/genmethods", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	want, _ := os.ReadFile(out)
	got, _ := os.ReadFile("methods_gen.go")
	if string(got) != string(want) {
		t.Errorf("methods_gen.go is stale: run go generate ./criproxy")
	}
}
