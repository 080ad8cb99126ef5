package credplugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	testclock "k8s.io/utils/clock/testing"
)

// fakeRunner answers a fixed response and counts runs; a seam like the
// kubelet's fakeExecPlugin.
type fakeRunner struct {
	keyType  credentialproviderapi.PluginCacheKeyType
	duration *time.Duration
	auth     map[string]credentialproviderapi.AuthConfig
	err      error
	gate     chan struct{} // when set, runs wait for it
	echo     bool          // answer the token as the password
	runs     atomic.Int32
	images   sync.Map // image -> true
	mu       sync.Mutex
	last     execRequest
}

func (f *fakeRunner) Run(_ context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
	f.runs.Add(1)
	f.images.Store(req.Image, true)
	f.mu.Lock()
	f.last = req
	f.mu.Unlock()
	if f.gate != nil {
		<-f.gate
	}
	if f.err != nil {
		return nil, []byte("diagnostics"), f.err
	}
	r := &credentialproviderapi.CredentialProviderResponse{CacheKeyType: f.keyType, Auth: f.auth}
	if f.echo {
		r.Auth = map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "token", Password: req.ServiceAccountToken}}
	}
	if f.duration != nil {
		r.CacheDuration = &metav1.Duration{Duration: *f.duration}
	}
	return r, nil, nil
}

func dur(d time.Duration) *time.Duration { return &d }

// newTestInjector builds an Injector whose providers run fakes.
func newTestInjector(t *testing.T, clk *testclock.FakeClock, providers ...struct {
	cfg    Provider
	runner runner
}) *Injector {
	t.Helper()
	cfg := &Config{Hash: "sha256:test"}
	for _, p := range providers {
		cfg.Providers = append(cfg.Providers, p.cfg)
	}
	in, err := New(cfg, Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range providers {
		in.plugins()[i].Runner = p.runner
	}
	return in
}

func prov(name string, defaultTTL time.Duration, r runner, match ...string) struct {
	cfg    Provider
	runner runner
} {
	return struct {
		cfg    Provider
		runner runner
	}{Provider{Name: name, MatchImages: match, DefaultCacheDuration: defaultTTL, APIVersion: "credentialprovider.kubelet.k8s.io/v1"}, r}
}

var cred = map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: "u", Password: "p"}}

func TestCacheDurations(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		defaultTTL time.Duration
		respTTL    *time.Duration
		step       time.Duration
		wantRuns   int32
	}{
		{"no cacheDuration: the provider's default applies", time.Minute, nil, 59 * time.Second, 1},
		{"no cacheDuration: expired after the default", time.Minute, nil, time.Minute, 2},
		{"no cacheDuration and a zero default: not cached", 0, nil, 0, 2},
		{"an explicit cacheDuration wins over the default", time.Hour, dur(time.Minute), time.Minute, 2},
		{"an explicit cacheDuration of 0: not cached", time.Hour, dur(0), 0, 2},
		{"a cacheDuration longer than the default holds", time.Second, dur(time.Hour), 30 * time.Minute, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.NewFakeClock(t0)
			f := &fakeRunner{keyType: "Image", duration: tc.respTTL, auth: cred}
			in := newTestInjector(t, clk, prov("p", tc.defaultTTL, f, "registry.test"))
			ctx := context.Background()
			in.Lookup(ctx, "registry.test/app", nil)
			clk.Step(tc.step)
			in.Lookup(ctx, "registry.test/app", nil)
			if got := f.runs.Load(); got != tc.wantRuns {
				t.Errorf("plugin ran %d times, want %d", got, tc.wantRuns)
			}
		})
	}
}

var t0 = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func TestCacheKeyTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		keyType  credentialproviderapi.PluginCacheKeyType
		second   string // the image looked up after registry.test/team/app
		wantRuns int32
	}{
		{"an Image answer serves the same image", "Image", "registry.test/team/app", 1},
		{"an Image answer does not serve another image", "Image", "registry.test/team/other", 2},
		{"a Registry answer serves every image of the registry", "Registry", "registry.test/other/x", 1},
		{"a Registry answer does not serve another registry", "Registry", "b.registry.test/x", 2},
		{"a Global answer serves every image the provider matches", "Global", "b.registry.test/x", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeRunner{keyType: tc.keyType, auth: cred}
			in := newTestInjector(t, testclock.NewFakeClock(t0), prov("p", time.Hour, f, "registry.test", "*.registry.test"))
			in.Lookup(context.Background(), "registry.test/team/app", nil)
			in.Lookup(context.Background(), tc.second, nil)
			if got := f.runs.Load(); got != tc.wantRuns {
				t.Errorf("plugin ran %d times, want %d", got, tc.wantRuns)
			}
		})
	}
}

func TestConcurrentPullsRunThePluginOnce(t *testing.T) {
	t.Parallel()
	f := &fakeRunner{keyType: "Image", auth: cred, gate: make(chan struct{})}
	in := newTestInjector(t, testclock.NewFakeClock(t0), prov("p", time.Hour, f, "registry.test"))
	var wg sync.WaitGroup
	var got atomic.Int32
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c, _, failed := in.Lookup(context.Background(), "registry.test/app", nil); len(c) == 1 && len(failed) == 0 {
				got.Add(1)
			}
		}()
	}
	for f.runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the other 63 join the flight
	close(f.gate)
	wg.Wait()
	if n := f.runs.Load(); n != 1 {
		t.Errorf("64 concurrent lookups ran the plugin %d times, want 1", n)
	}
	if got.Load() != 64 {
		t.Errorf("%d of 64 lookups got the credential", got.Load())
	}
}

func TestLookupMatchesProviders(t *testing.T) {
	t.Parallel()
	failing := &fakeRunner{err: fmt.Errorf("plugin broken: %w", ErrPluginFailed)}
	other := &fakeRunner{keyType: "Global", auth: cred}
	matching := &fakeRunner{keyType: "Global", auth: cred}
	in := newTestInjector(t, testclock.NewFakeClock(t0),
		prov("other", time.Hour, other, "other.test"),
		prov("broken", time.Hour, failing, "*.test"),
		prov("good", time.Hour, matching, "registry.test"))
	cands, answers, failed := in.Lookup(context.Background(), "registry.test/app", nil)
	if other.runs.Load() != 0 {
		t.Errorf("a provider that does not match the image ran")
	}
	if _, ok := matching.images.Load("registry.test/app"); !ok {
		t.Errorf("the plugin did not get the repository without tag")
	}
	if len(failed) != 1 || failed[0].Provider != "broken" || !errors.Is(failed[0].Err, ErrPluginFailed) {
		t.Errorf("failed = %+v", failed)
	}
	if len(answers) != 1 || len(cands) != 1 || cands[0].Provider != "good" {
		t.Errorf("a failing provider kept the others from answering: %+v", cands)
	}
}

func TestCandidateOrder(t *testing.T) {
	t.Parallel()
	c := func(u string) Credential { return Credential{Username: u, Password: u + "-pw"} }
	for _, tc := range []struct {
		name    string
		image   string
		answers []Answer
		want    []string // provider/key of each candidate, in order
	}{
		{
			name:  "longer keys first, non-matching keys left out",
			image: "registry.test/team/app",
			answers: []Answer{{Provider: "p", Auth: Auth{
				"registry.test": c("a"), "registry.test/team": c("b"), "registry.test/team/app": c("c"), "registry.test/other": c("x"), "other.test": c("y"),
			}}},
			want: []string{"p/registry.test/team/app", "p/registry.test/team", "p/registry.test"},
		},
		{
			name:  "keys without a glob before keys with one",
			image: "a.registry.test/app",
			answers: []Answer{{Provider: "p", Auth: Auth{
				"*.registry.test/app": c("glob-long"), "a.registry.test": c("exact"), "*.*.test": c("glob2"),
			}}},
			want: []string{"p/a.registry.test", "p/*.registry.test/app", "p/*.*.test"},
		},
		{
			name:  "the earlier provider wins a shared key; both are tried",
			image: "registry.test/app",
			answers: []Answer{
				{Provider: "first", Auth: Auth{"registry.test": c("one")}},
				{Provider: "second", Auth: Auth{"registry.test": c("two"), "registry.test/app": c("three")}},
			},
			want: []string{"second/registry.test/app", "first/registry.test", "second/registry.test"},
		},
		{
			name:    "a scheme and a /v2/ path in a key are the same registry",
			image:   "registry.test/app",
			answers: []Answer{{Provider: "p", Auth: Auth{"https://registry.test/v2/": c("a")}}},
			want:    []string{"p/https://registry.test/v2/"},
		},
		{
			name:    "a port must match",
			image:   "registry.test:5000/app",
			answers: []Answer{{Provider: "p", Auth: Auth{"registry.test": c("a"), "registry.test:5000": c("b")}}},
			want:    []string{"p/registry.test:5000"},
		},
		{
			name:    "Docker Hub images fall back to index.docker.io keys",
			image:   "docker.io/library/nginx",
			answers: []Answer{{Provider: "p", Auth: Auth{"https://index.docker.io/v1/": c("hub")}}},
			want:    []string{"p/https://index.docker.io/v1/"},
		},
		{
			name:    "an organisation's Docker Hub image falls back to docker login's key",
			image:   "docker.io/org/app",
			answers: []Answer{{Provider: "p", Auth: Auth{"index.docker.io": c("hub"), "registry.test": c("x")}}},
			want:    []string{"p/index.docker.io"},
		},
		{
			name:  "a key that matches in one answer turns Docker Hub's fallback off in all, as in the kubelet's keyring",
			image: "docker.io/org/app",
			answers: []Answer{
				{Provider: "hub", Auth: Auth{"https://index.docker.io/v1/": c("hub")}},
				{Provider: "org", Auth: Auth{"docker.io/org": c("org")}},
			},
			want: []string{"org/docker.io/org"},
		},
		{
			name:    "another registry's image does not fall back to Docker Hub's key",
			image:   "registry.test/library/nginx",
			answers: []Answer{{Provider: "p", Auth: Auth{"https://index.docker.io/v1/": c("hub")}}},
			want:    nil,
		},
		{
			name:    "the same credential under two keys is tried once",
			image:   "registry.test/app",
			answers: []Answer{{Provider: "p", Auth: Auth{"registry.test": c("a"), "*.test": c("a")}}},
			want:    []string{"p/registry.test"},
		},
		{
			name:    "no matching key, no candidate",
			image:   "elsewhere.test/app",
			answers: []Answer{{Provider: "p", Auth: Auth{"registry.test": c("a")}}},
			want:    nil,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, cand := range candidates(tc.image, tc.answers) {
				got = append(got, cand.Provider+"/"+cand.Key)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
