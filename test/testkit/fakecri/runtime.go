package fakecri

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is a CRI v1 runtime in memory. Its methods are safe for
// concurrent use, while it serves.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer

	name string // its RuntimeName, to tell two runtimes apart

	mu           sync.Mutex
	images       map[string]*runtimeapi.Image // by ID; never changed once held
	calls        map[string]int               // method -> calls
	contentTypes map[string]map[string]bool   // method -> the content-types its calls came with
	failures     map[string]error             // method -> what its calls get
	beforePull   func(context.Context, *runtimeapi.PullImageRequest) error
}

// New returns a Runtime named name holding images.
func New(name string, images ...*runtimeapi.Image) *Runtime {
	r := &Runtime{name: name, images: map[string]*runtimeapi.Image{}, calls: map[string]int{},
		contentTypes: map[string]map[string]bool{}, failures: map[string]error{}}
	r.Put(images...)
	return r
}

// Image is an image of ID id tagged names, as Put takes it.
func Image(id string, names ...string) *runtimeapi.Image {
	return &runtimeapi.Image{Id: id, RepoTags: names, Size: 1}
}

// Put makes the runtime hold copies of images, each in place of any it
// held of the same ID.
func (r *Runtime) Put(images ...*runtimeapi.Image) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, img := range images {
		r.images[img.GetId()] = proto.CloneOf(img)
	}
}

// Calls returns how many calls of method the runtime was made.
func (r *Runtime) Calls(method string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[methodKey(method)]
}

// ContentTypes returns the content-types calls of method came with, each
// once, sorted: a runtime may care (CRI-O's socket serves gRPC only for
// "application/grpc").
func (r *Runtime) ContentTypes(method string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.contentTypes[methodKey(method)]))
}

// Fail makes every later call of method fail with err, once counted and
// reported; nil makes it answer again.
func (r *Runtime) Fail(method string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.failures, methodKey(method))
		return
	}
	r.failures[methodKey(method)] = err
}

// BeforePull makes f run at the start of every later PullImage, outside
// the runtime's lock: an error is the pull's answer, nil lets it go on.
// A test makes a pull slow with it, or fail as one runtime does. Nil
// removes it.
func (r *Runtime) BeforePull(f func(context.Context, *runtimeapi.PullImageRequest) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.beforePull = f
}

// arrive is what every call meets first: it is counted, its content-type
// noted, and what it brought reported; the error is the failure set for
// its method, if any.
func (r *Runtime) arrive(ctx context.Context, fullMethod string) error {
	key := methodKey(fullMethod)
	r.mu.Lock()
	r.calls[key]++
	if r.contentTypes[key] == nil {
		r.contentTypes[key] = map[string]bool{}
	}
	for _, ct := range incoming(ctx, "content-type") {
		r.contentTypes[key][ct] = true
	}
	err := r.failures[key]
	r.mu.Unlock()
	report(ctx)
	return err
}

// methodKey is how the runtime keeps a method: a CRI v1 method by its
// name alone, any other by its full name.
func methodKey(method string) string {
	for _, svc := range []string{runtimeapi.RuntimeService_ServiceDesc.ServiceName, runtimeapi.ImageService_ServiceDesc.ServiceName} {
		if name, ok := strings.CutPrefix(method, "/"+svc+"/"); ok {
			return name
		}
	}
	return method
}

// find returns the image name names (its ID, a tag or a digest), or nil;
// r.mu is held.
func (r *Runtime) find(name string) *runtimeapi.Image {
	if img, ok := r.images[name]; ok {
		return img
	}
	for _, img := range r.images {
		if slices.Contains(img.RepoTags, name) || slices.Contains(img.RepoDigests, name) {
			return img
		}
	}
	return nil
}

func (r *Runtime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: r.name, RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}, nil
}

func (r *Runtime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}}, nil
}

func (r *Runtime) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return &runtimeapi.ImageStatusResponse{Image: r.find(req.GetImage().GetImage())}, nil
}

func (r *Runtime) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	resp := &runtimeapi.ListImagesResponse{}
	for _, id := range slices.Sorted(maps.Keys(r.images)) {
		resp.Images = append(resp.Images, r.images[id])
	}
	return resp, nil
}

func (r *Runtime) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	r.mu.Lock()
	before := r.beforePull
	r.mu.Unlock()
	if before != nil {
		if err := before(ctx, req); err != nil {
			return nil, err
		}
	}
	name := req.GetImage().GetImage()
	r.mu.Lock()
	defer r.mu.Unlock()
	img := r.find(name)
	if img == nil {
		img = Image("sha256:pulled-"+name, name)
		r.images[img.Id] = img
	}
	return &runtimeapi.PullImageResponse{ImageRef: img.Id}, nil
}

func (r *Runtime) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if img := r.find(req.GetImage().GetImage()); img != nil {
		delete(r.images, img.Id)
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

func (r *Runtime) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

func (r *Runtime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	return &runtimeapi.CreateContainerResponse{ContainerId: "ctr-" + req.GetConfig().GetImage().GetImage()}, nil
}

func (r *Runtime) RemovePodSandbox(context.Context, *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (r *Runtime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, ss runtimeapi.RuntimeService_GetContainerEventsServer) error {
	for i := range 3 {
		if err := ss.Send(&runtimeapi.ContainerEventResponse{ContainerId: fmt.Sprint("c", i)}); err != nil {
			return err
		}
	}
	return status.Error(codes.Aborted, "events end here")
}
