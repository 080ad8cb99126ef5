package credplugins

import (
	"context"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	testclock "k8s.io/utils/clock/testing"
)

// BenchmarkPullImageHookCacheHit is the hook's own cost on a cache hit:
// everything the injector adds to a pull, without the pull.
func BenchmarkPullImageHookCacheHit(b *testing.B) {
	r := &fakeRunner{keyType: "Registry", auth: map[string]credentialproviderapi.AuthConfig{"registry.test:5000": {Username: "u", Password: "p"}}}
	cfg := &Config{Hash: "h", Providers: []Provider{{Name: "p", MatchImages: []string{"registry.test:5000"}, DefaultCacheDuration: time.Hour}}}
	in, err := New(cfg, Options{Clock: testclock.NewFakeClock(t0)})
	if err != nil {
		b.Fatal(err)
	}
	in.plugins()[0].runner = r
	req := pull("registry.test:5000/team-a/app:v1", nil)
	resp := &runtimeapi.PullImageResponse{ImageRef: "sha256:abc"}
	next := func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		return resp, nil
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := in.PullImage(ctx, req, next); err != nil {
			b.Fatal(err)
		}
	}
	if r.runs.Load() != 1 {
		b.Fatalf("plugin ran %d times", r.runs.Load())
	}
}
