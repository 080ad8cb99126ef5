package credplugins

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
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
	in.plugins()[0].Runner = r
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

// BenchmarkColdBurstOf100Pulls is 100 pulls of one image arriving at once,
// nothing cached, the token plugin taking 10 ms: its "runs/100pulls" is
// what merging concurrent runs saves. Pulls of one pod (its containers)
// share one token and one run; pulls of 100 pods of one service account
// run once per pod's token, as in the kubelet, and not once for all with
// the first pod's token. The answers are then cached per account: the
// cost is the cold burst's only.
func BenchmarkColdBurstOf100Pulls(b *testing.B) {
	const pulls = 100
	for _, tc := range []struct {
		name string
		pods int
	}{{"one pod", 1}, {"100 pods of one service account", pulls}} {
		b.Run(tc.name, func(b *testing.B) {
			objs := []runtime.Object{sa("team-a", "builder", "sa-uid-1", map[string]string{"registry.test/user": "alice"})}
			refs := make([]*PodRef, tc.pods)
			for i := range refs {
				name, uid := fmt.Sprintf("p%d", i), fmt.Sprintf("pod-%d", i)
				objs = append(objs, kpod("team-a", name, uid, "builder"))
				refs[i] = &PodRef{Namespace: "team-a", Name: name, UID: uid}
			}
			var runs int32
			for b.Loop() {
				b.StopTimer()
				r := &slowRunner{delay: 10 * time.Millisecond}
				in := newTokenInjector(b, newFakeAPI(objs...), tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, nil), r)
				b.StartTimer()
				var wg sync.WaitGroup
				for i := range pulls {
					wg.Add(1)
					go func() {
						defer wg.Done()
						in.Lookup(context.Background(), "registry.test/team-a/app", refs[i%len(refs)])
					}()
				}
				wg.Wait()
				runs += r.runs.Load()
			}
			b.ReportMetric(float64(runs)/float64(b.N), "runs/100pulls")
		})
	}
}

// slowRunner answers a fixed credential after delay, as an exec would.
type slowRunner struct {
	delay time.Duration
	runs  atomic.Int32
}

func (r *slowRunner) Run(context.Context, execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
	r.runs.Add(1)
	time.Sleep(r.delay)
	return &credentialproviderapi.CredentialProviderResponse{CacheKeyType: "Registry", Auth: cred}, nil, nil
}
