package bake

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// fakeRuntime pulls every image but those named "missing", and those
// under /private/ only with alice's password; it counts pulls in flight.
type fakeRuntime struct {
	inFlight, maxInFlight atomic.Int32
	mu                    sync.Mutex
	present               map[string]string // image -> ID
}

func (f *fakeRuntime) PullImage(ctx context.Context, in *runtimeapi.PullImageRequest, _ ...grpc.CallOption) (*runtimeapi.PullImageResponse, error) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxInFlight.Load()
		if n <= m || f.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(5 * time.Millisecond) // let the others overlap
	img := in.GetImage().GetImage()
	switch {
	case strings.Contains(img, "missing"):
		return nil, status.Error(codes.NotFound, "manifest unknown")
	case strings.Contains(img, "/private/") && in.GetAuth().GetPassword() != "alice-secret":
		return nil, status.Error(codes.Unknown, "401 Unauthorized")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := "sha256:" + strings.Repeat(string(rune('a'+len(f.present))), 64)
	f.present[img] = id
	return &runtimeapi.PullImageResponse{ImageRef: id}, nil
}

func (f *fakeRuntime) ImageStatus(_ context.Context, in *runtimeapi.ImageStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	img := in.GetImage().GetImage()
	id, ok := f.present[img]
	if !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	repo, _, _ := strings.Cut(img, ":v")
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: id, Size: 3 << 20,
		RepoDigests: []string{"other.test/x@sha256:1111", repo + "@sha256:2222"}}}, nil
}

// aliceHook gives every pull alice's credential, as a plugin would, and
// says its provider.
type aliceHook struct{}

func (aliceHook) Pull(ctx context.Context, req *runtimeapi.PullImageRequest, try func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error)) (*runtimeapi.PullImageResponse, pullcred.Used, error) {
	r := proto.CloneOf(req)
	r.Auth = &runtimeapi.AuthConfig{Username: "alice", Password: "alice-secret"}
	resp, err := try(ctx, r)
	if err != nil {
		return nil, pullcred.Used{}, err
	}
	return resp, pullcred.Used{Provider: "alice-plugin"}, nil
}

func TestPull(t *testing.T) {
	t.Parallel()
	images := []string{"registry.test/private/a:v1", "registry.test/public/b:v1", "registry.test/missing:v1", "registry.test/private/c:v1", "registry.test/public/d:v1"}

	t.Run("every image gets a result in order; a failure does not stop the others", func(t *testing.T) {
		rt := &fakeRuntime{present: map[string]string{}}
		res := Pull(context.Background(), rt, images, Options{Parallel: 2, Credentials: aliceHook{}})
		var got []string
		for _, r := range res {
			got = append(got, r.Image)
		}
		if !slices.Equal(got, images) {
			t.Fatalf("results for %q", got)
		}
		for i, r := range res {
			if (i == 2) != (r.Err != nil) {
				t.Errorf("%s: err %v", r.Image, r.Err)
			}
			if r.Err == nil && (r.ImageID == "" || r.Digest != "sha256:2222" || r.Size != 3<<20 || r.Provider != "alice-plugin" || !r.Done) {
				t.Errorf("%s: %+v", r.Image, r)
			}
		}
		if status.Code(res[2].Err) != codes.NotFound {
			t.Errorf("the runtime's code is lost: %v", res[2].Err)
		}
	})
	t.Run("no more than Parallel pulls run at a time", func(t *testing.T) {
		rt := &fakeRuntime{present: map[string]string{}}
		Pull(context.Background(), rt, images, Options{Parallel: 2, Credentials: aliceHook{}})
		if m := rt.maxInFlight.Load(); m > 2 || m < 1 {
			t.Errorf("%d pulls at once, want at most 2", m)
		}
	})
	t.Run("without credentials the private images fail and the public ones pass", func(t *testing.T) {
		rt := &fakeRuntime{present: map[string]string{}}
		res := Pull(context.Background(), rt, images, Options{})
		var failed []string
		for _, r := range Failed(res) {
			failed = append(failed, r.Image)
		}
		want := []string{"registry.test/private/a:v1", "registry.test/missing:v1", "registry.test/private/c:v1"}
		if !slices.Equal(failed, want) {
			t.Errorf("failed %q, want %q", failed, want)
		}
	})
	t.Run("progress hears of each image twice, started then done", func(t *testing.T) {
		rt := &fakeRuntime{present: map[string]string{}}
		seen := map[string][]bool{}
		Pull(context.Background(), rt, images, Options{Parallel: 3, Progress: func(r Result) { seen[r.Image] = append(seen[r.Image], r.Done) }})
		for _, img := range images {
			if !slices.Equal(seen[img], []bool{false, true}) {
				t.Errorf("%s: %v", img, seen[img])
			}
		}
	})
}

func TestPreload(t *testing.T) {
	t.Parallel()
	ok1 := Result{Image: "registry.test/team/app:v1", ImageID: "sha256:" + strings.Repeat("1", 64)}
	ok2 := Result{Image: "registry.test/team/app:v2", ImageID: "sha256:" + strings.Repeat("2", 64)}
	ok3 := Result{Image: "docker.io/library/nginx:latest", ImageID: "sha256:" + strings.Repeat("3", 64)}
	bad := Result{Image: "registry.test/bad:v1", Err: errors.New("401")}
	results := []Result{ok1, bad, ok2, ok3}

	t.Run("the allowlist is the pulled images' repositories, sorted, once each", func(t *testing.T) {
		want := []string{"docker.io/library/nginx", "registry.test/team/app"}
		if got := Repositories(results); !slices.Equal(got, want) {
			t.Errorf("got %q, want %q", got, want)
		}
	})
	t.Run("records make each pulled image accessible to every pod, twice is once", func(t *testing.T) {
		s, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for range 2 {
			if err := RecordPreloaded(s, results, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range []Result{ok1, ok2, ok3} {
			rec, err := s.Get(r.ImageID)
			if err != nil {
				t.Fatalf("%s: %v", r.Image, err)
			}
			if len(rec.CredentialMapping) != 1 {
				t.Errorf("%s: mapping %v", r.Image, rec.CredentialMapping)
			}
			for repo, c := range rec.CredentialMapping {
				if !c.NodePodsAccessible || !strings.HasPrefix(r.Image, repo+":") {
					t.Errorf("%s: %s -> %+v", r.Image, repo, c)
				}
			}
		}
		if n, _, _ := s.Counts(); n != 3 {
			t.Errorf("%d records, want 3", n)
		}
		for _, r := range []Result{ok1, ok2, ok3} {
			if got := s.Preloaded(r.ImageID); !slices.Equal(got, []string{r.Image}) {
				t.Errorf("%s: preloaded names %q, want its own", r.Image, got)
			}
		}
	})
	t.Run("an image baked under two names keeps both as its preloaded names", func(t *testing.T) {
		s, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		alias := Result{Image: "registry.test/other/app:base", ImageID: ok1.ImageID}
		if err := RecordPreloaded(s, []Result{ok1, alias}, time.Now()); err != nil {
			t.Fatal(err)
		}
		if got, want := s.Preloaded(ok1.ImageID), []string{"registry.test/other/app:base", ok1.Image}; !slices.Equal(got, want) {
			t.Errorf("preloaded names %q, want %q", got, want)
		}
	})
}
