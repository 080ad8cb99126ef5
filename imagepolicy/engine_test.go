package imagepolicy

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/policyapi"
)

// fakeRunner answers a fixed verdict, or fails, and records what it was
// asked.
type fakeRunner struct {
	mu      sync.Mutex
	asked   []policyapi.ImagePolicyRequest
	resp    policyapi.ImagePolicyResponse
	err     error
	release chan struct{} // when set, a run waits for it
}

func (f *fakeRunner) Run(_ context.Context, req policyapi.ImagePolicyRequest) (*policyapi.ImagePolicyResponse, []byte, error) {
	f.mu.Lock()
	f.asked = append(f.asked, req)
	resp, err, release := f.resp, f.err, f.release
	f.mu.Unlock()
	if release != nil {
		<-release
	}
	if err != nil {
		return nil, []byte("diagnostics"), err
	}
	return &resp, nil, nil
}

func (f *fakeRunner) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

func (f *fakeRunner) last() policyapi.ImagePolicyRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[len(f.asked)-1]
}

func (f *fakeRunner) set(resp policyapi.ImagePolicyResponse, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resp, f.err = resp, err
}

// testAllow is the fake plugins' default verdict.
var testAllow = policyapi.Allow("signed by release-key")

// testProvider is a provider with the defaults LoadConfig gives.
func testProvider(name string, namespaces []string, matchImages ...string) Provider {
	return Provider{Name: name, APIVersion: policyapi.V1alpha1, MatchImages: matchImages, Namespaces: namespaces,
		Timeout: DefaultTimeout, FailurePolicy: Fail, AllowCacheDuration: DefaultAllowCacheDuration, DenyCacheDuration: DefaultDenyCacheDuration}
}

type testEngine struct {
	*Engine
	runners map[string]*fakeRunner
	clock   *testclock.FakeClock
	reg     *prometheus.Registry
	log     *bytes.Buffer
}

// newTestEngine returns an engine whose providers answer allow through
// fake runners.
func newTestEngine(t *testing.T, cfg *Config) *testEngine {
	t.Helper()
	c := *cfg // parallel tests share a configuration
	if c.Hash == "" {
		c.Hash = "sha256:test"
	}
	cfg = &c
	te := &testEngine{runners: map[string]*fakeRunner{}, clock: testclock.NewFakeClock(time.Unix(1_800_000_000, 0)), reg: prometheus.NewRegistry(), log: &bytes.Buffer{}}
	var err error
	te.Engine, err = New(cfg, Options{Clock: te.clock, Registerer: te.reg, Logger: slog.New(slog.NewTextHandler(te.log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	te.fake()
	return te
}

// fake puts fake runners in the current providers, keeping those of
// providers already faked.
func (te *testEngine) fake() {
	for _, p := range te.current().providers {
		f, ok := te.runners[p.cfg.Name]
		if !ok {
			f = &fakeRunner{resp: testAllow}
			te.runners[p.cfg.Name] = f
		}
		p.Runner = f
	}
}

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	imageID = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
)

func pull(ns, repo, digest string) Subject {
	return Subject{Call: CallPullImage, Image: repo + ":v1", Repository: repo, Digest: digest, Pod: Pod{Namespace: ns, Name: "web", UID: "uid-1"}}
}

func create(ns, repo, id string) Subject {
	return Subject{Call: CallCreateContainer, Image: id, Repository: repo, ImageID: id, Pod: Pod{Namespace: ns, Name: "web", UID: "uid-1"}}
}

func TestDecideWhichProvidersApply(t *testing.T) {
	t.Parallel()
	cfg := &Config{DefaultNamespace: "node", Providers: []Provider{
		testProvider("secure-only", []string{"secure"}, "registry.test"),
		testProvider("everywhere-example", []string{"*"}, "*.example.com"),
		testProvider("node-pulls", []string{"node"}, "registry.test"),
	}}
	for _, tc := range []struct {
		name string
		s    Subject
		want []string // providers asked
	}{
		{"a provider applies to its namespace and images", pull("secure", "registry.test/app", digestA), []string{"secure-only"}},
		{"not to another namespace", pull("other", "registry.test/app", digestA), nil},
		{"not to other images of its namespace", pull("secure", "docker.io/library/nginx", digestA), nil},
		{"a * provider applies to every namespace", pull("other", "eu.example.com/app", digestA), []string{"everywhere-example"}},
		{"a pull without a namespace is decided for the default namespace", pull("", "registry.test/app", digestA), []string{"node-pulls"}},
		{"an image known by ID only gets every provider of its namespace", create("secure", "", imageID), []string{"secure-only", "everywhere-example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			te := newTestEngine(t, cfg)
			v, err := te.Decide(context.Background(), tc.s)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range v.Decisions {
				got = append(got, d.Provider)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") || !v.Allowed {
				t.Errorf("asked %v, allowed %v; want %v, allowed", got, v.Allowed, tc.want)
			}
			for name, f := range te.runners {
				if n := f.calls(); n > 0 && !strings.Contains(strings.Join(tc.want, ","), name) {
					t.Errorf("%s ran %d times", name, n)
				}
			}
			if len(tc.want) == 0 && !strings.Contains(v.Reason(), "no image policy provider applies") {
				t.Errorf("reason %q", v.Reason())
			}
		})
	}
}

func TestDecideRefusal(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, &Config{Providers: []Provider{
		testProvider("first", []string{"secure"}, "registry.test"),
		testProvider("second", []string{"secure"}, "registry.test"),
		testProvider("third", []string{"secure"}, "registry.test"),
	}})
	te.runners["second"].set(policyapi.Deny("no signature of release-key on "+digestA, "image is not signed by a trusted key"), nil)
	v, err := te.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
	if err != nil {
		t.Fatal(err)
	}
	if v.Allowed || len(v.Decisions) != 2 || te.runners["third"].calls() != 0 {
		t.Fatalf("verdict %+v: want refused by second, third not asked", v)
	}
	if v.PodReason != "image is not signed by a trusted key" || !strings.Contains(v.Reason(), "second refused: no signature of release-key") {
		t.Errorf("reasons %q / %q", v.PodReason, v.Reason())
	}
	err = v.Err()
	if !errors.Is(err, ErrDenied) || !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "image is not signed by a trusted key") {
		t.Errorf("Err() = %v", err)
	}
	if !strings.Contains(te.log.String(), `level=INFO msg="image policy refused an image"`) {
		t.Errorf("no refusal in the log:\n%s", te.log)
	}
	if got := testutil.ToFloat64(te.metrics.decisions.WithLabelValues("second", "PullImage", "denied", "plugin")); got != 1 {
		t.Errorf("denied decisions of second: %v", got)
	}

	t.Run("a refusal without a pod reason gets one naming the provider", func(t *testing.T) {
		te.runners["second"].set(policyapi.Deny("unsigned", ""), nil)
		v, _ := te.Decide(context.Background(), pull("secure", "registry.test/app", digestB))
		if v.Allowed || v.PodReason != "refused by image policy second" {
			t.Errorf("verdict %+v", v)
		}
	})
}

func TestDecideCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	newEngine := func(t *testing.T) (*testEngine, *fakeRunner) {
		p := testProvider("sig", []string{"secure", "other"}, "registry.test")
		p.AllowCacheDuration, p.DenyCacheDuration = time.Hour, time.Minute
		te := newTestEngine(t, &Config{Providers: []Provider{p}})
		return te, te.runners["sig"]
	}
	decide := func(t *testing.T, te *testEngine, s Subject) Verdict {
		t.Helper()
		v, err := te.Decide(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	t.Run("an allow is cached for the allow duration, then asked again", func(t *testing.T) {
		te, f := newEngine(t)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		if f.calls() != 1 || !v.Decisions[0].FromCache || !v.Allowed {
			t.Fatalf("calls %d, verdict %+v", f.calls(), v)
		}
		te.clock.Step(time.Hour)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		if f.calls() != 2 {
			t.Errorf("calls %d after expiry, want 2", f.calls())
		}
	})
	t.Run("a deny is cached for the deny duration", func(t *testing.T) {
		te, f := newEngine(t)
		f.set(policyapi.Deny("unsigned", "unsigned"), nil)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		te.clock.Step(59 * time.Second)
		if v := decide(t, te, pull("secure", "registry.test/app", digestA)); v.Allowed || !v.Decisions[0].FromCache {
			t.Errorf("verdict %+v, want the cached deny", v)
		}
		te.clock.Step(time.Second)
		f.set(policyapi.Allow("signed since"), nil)
		if v := decide(t, te, pull("secure", "registry.test/app", digestA)); !v.Allowed || f.calls() != 2 {
			t.Errorf("verdict %+v after the deny expired, calls %d", v, f.calls())
		}
	})
	t.Run("a verdict's own cache duration wins, 0 not caching it", func(t *testing.T) {
		te, f := newEngine(t)
		resp := policyapi.Allow("ok")
		resp.CacheDuration = &metav1.Duration{}
		f.set(resp, nil)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		decide(t, te, pull("secure", "registry.test/app", digestA))
		if f.calls() != 2 {
			t.Errorf("calls %d, want 2: cacheDuration 0 caches nothing", f.calls())
		}
	})
	t.Run("a verdict holds for its namespace only", func(t *testing.T) {
		te, f := newEngine(t)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		decide(t, te, pull("other", "registry.test/app", digestA))
		if f.calls() != 2 {
			t.Errorf("calls %d, want 2", f.calls())
		}
	})
	t.Run("a verdict holds for its digest only: a moved tag is asked again", func(t *testing.T) {
		te, f := newEngine(t)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		decide(t, te, pull("secure", "registry.test/app", digestB))
		if f.calls() != 2 {
			t.Errorf("calls %d, want 2", f.calls())
		}
	})
	t.Run("a verdict holds for its repository only: the same digest in another repository is asked again", func(t *testing.T) {
		te, f := newEngine(t)
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		te.Bind(v, imageID)
		decide(t, te, pull("secure", "registry.test/copy", digestA))
		decide(t, te, create("secure", "registry.test/copy", imageID))
		if f.calls() != 3 {
			t.Errorf("calls %d, want 3: a plugin may decide per repository", f.calls())
		}
	})
	t.Run("after Bind, a create by image ID finds the pull's verdict", func(t *testing.T) {
		te, f := newEngine(t)
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		te.Bind(v, imageID)
		te.clock.Step(30 * time.Minute)
		c := decide(t, te, create("secure", "registry.test/app", imageID))
		if f.calls() != 1 || !c.Allowed || !c.Decisions[0].FromCache {
			t.Errorf("calls %d, verdict %+v: want the pull's verdict from the cache", f.calls(), c)
		}
		te.clock.Step(30 * time.Minute)
		decide(t, te, create("secure", "registry.test/app", imageID))
		if f.calls() != 2 {
			t.Errorf("calls %d: the bound verdict must expire with the pull's", f.calls())
		}
		if last := f.last(); last.ImageID != imageID || last.Call != CallCreateContainer {
			t.Errorf("asked %+v", last)
		}
	})
	t.Run("a create in another namespace is asked, the pull's verdict is not its", func(t *testing.T) {
		te, f := newEngine(t)
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		te.Bind(v, imageID)
		decide(t, te, create("other", "registry.test/app", imageID))
		if f.calls() != 2 {
			t.Errorf("calls %d, want 2", f.calls())
		}
	})
	t.Run("a refusal is not bound", func(t *testing.T) {
		te, f := newEngine(t)
		f.set(policyapi.Deny("unsigned", "unsigned"), nil)
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		te.Bind(v, imageID)
		f.set(policyapi.Allow("ok"), nil)
		decide(t, te, create("secure", "registry.test/app", imageID))
		if f.calls() != 2 {
			t.Errorf("calls %d, want 2", f.calls())
		}
	})
	t.Run("a reload drops every cached verdict, and a verdict of before is not bound", func(t *testing.T) {
		te, f := newEngine(t)
		v := decide(t, te, pull("secure", "registry.test/app", digestA))
		if err := te.Reload(te.Config()); err != nil {
			t.Fatal(err)
		}
		te.fake()
		te.Bind(v, imageID)
		decide(t, te, pull("secure", "registry.test/app", digestA))
		decide(t, te, create("secure", "registry.test/app", imageID))
		if f.calls() != 3 {
			t.Errorf("calls %d, want 3: nothing cached survives a reload", f.calls())
		}
	})
	t.Run("concurrent decisions for one image and namespace run the plugin once", func(t *testing.T) {
		te, f := newEngine(t)
		f.release = make(chan struct{})
		var wg sync.WaitGroup
		var allowed atomic.Int32
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if v, _ := te.Decide(ctx, pull("secure", "registry.test/app", digestA)); v.Allowed {
					allowed.Add(1)
				}
			}()
		}
		for f.calls() == 0 {
			time.Sleep(time.Millisecond)
		}
		close(f.release)
		wg.Wait()
		if f.calls() != 1 || allowed.Load() != 8 {
			t.Errorf("calls %d, allowed %d", f.calls(), allowed.Load())
		}
	})
}

func TestDecideFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		policy  FailurePolicy
		allowed bool
		result  string
	}{
		{"under Fail a fault refuses", Fail, false, resultFailedClosed},
		{"under Ignore a fault allows", Ignore, true, resultFailedOpen},
	} {
		t.Run(tc.name+", is logged with its cause and is not cached", func(t *testing.T) {
			t.Parallel()
			p := testProvider("sig", []string{"secure"}, "registry.test")
			p.FailurePolicy = tc.policy
			te := newTestEngine(t, &Config{Providers: []Provider{p}})
			f := te.runners["sig"]
			f.set(policyapi.ImagePolicyResponse{}, errors.New("plugin sig: plugin timed out after 30s"))
			for range 2 {
				v, err := te.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed != tc.allowed || v.Decisions[0].Fault == "" || v.Decisions[0].FromCache {
					t.Fatalf("verdict %+v", v)
				}
				if !tc.allowed && v.PodReason != "image policy sig could not decide; refused (see the node's log)" {
					t.Errorf("pod reason %q", v.PodReason)
				}
				if !strings.Contains(v.Reason(), "plugin timed out after 30s") || !strings.Contains(v.Reason(), "failurePolicy "+string(tc.policy)) {
					t.Errorf("reason %q", v.Reason())
				}
			}
			if f.calls() != 2 {
				t.Errorf("calls %d, want 2: a fault is not cached", f.calls())
			}
			if !strings.Contains(te.log.String(), `level=WARN msg="image policy plugin gave no verdict" plugin=sig failurePolicy=`+string(tc.policy)) {
				t.Errorf("log:\n%s", te.log)
			}
			if got := testutil.ToFloat64(te.metrics.decisions.WithLabelValues("sig", "PullImage", tc.result, "plugin")); got != 2 {
				t.Errorf("%s decisions: %v", tc.result, got)
			}
		})
	}
}

func TestDecideCredentials(t *testing.T) {
	t.Parallel()
	with := testProvider("with", []string{"secure"}, "registry.test")
	with.SendCredentials = true
	te := newTestEngine(t, &Config{DefaultNamespace: "node", Providers: []Provider{with, testProvider("without", []string{"secure"}, "registry.test")}})
	s := pull("secure", "registry.test/app", digestA)
	s.Credential = &Credential{Username: "tenant-a", Password: "s3cret-pw"}
	s.Platform = &Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	s.Pod.Static, s.Pod.ServiceAccount = true, "builder"
	if _, err := te.Decide(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	got := te.runners["with"].last()
	if got.Credential == nil || *got.Credential != *s.Credential {
		t.Errorf("a sendCredentials provider got credential %v", got.Credential)
	}
	if got.Pod != s.Pod || *got.Platform != *s.Platform || got.Digest != digestA || got.Repository != "registry.test/app" || got.Image != "registry.test/app:v1" {
		t.Errorf("request %+v", got)
	}
	if c := te.runners["without"].last().Credential; c != nil {
		t.Errorf("a provider without sendCredentials got %v", c)
	}
	if strings.Contains(te.log.String(), "s3cret-pw") {
		t.Errorf("the log holds the password:\n%s", te.log)
	}

	t.Run("a pull without a namespace names the default namespace to the plugin", func(t *testing.T) {
		te := newTestEngine(t, &Config{DefaultNamespace: "node", Providers: []Provider{testProvider("p", []string{"node"}, "registry.test")}})
		te.Decide(context.Background(), pull("", "registry.test/app", digestA))
		if ns := te.runners["p"].last().Pod.Namespace; ns != "node" {
			t.Errorf("namespace %q", ns)
		}
	})
}

func TestDecideInvalidSubject(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, &Config{Providers: []Provider{testProvider("p", []string{"*"}, "registry.test")}})
	for _, tc := range []struct {
		name string
		s    Subject
	}{
		{"no digest and no image ID", Subject{Call: CallPullImage, Image: "registry.test/app:v1", Pod: Pod{Namespace: "n"}}},
		{"no image", Subject{Call: CallPullImage, Digest: digestA}},
		{"an unknown call", Subject{Call: "RemoveImage", Image: "x", Digest: digestA}},
	} {
		t.Run(tc.name+" is an error and a refusal", func(t *testing.T) {
			v, err := te.Decide(context.Background(), tc.s)
			if !errors.Is(err, ErrInvalidSubject) || v.Allowed || v.Err() == nil {
				t.Errorf("verdict %+v, err %v", v, err)
			}
		})
	}
}

func TestExplain(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, &Config{Providers: []Provider{
		testProvider("sig", []string{"secure"}, "registry.test"),
		testProvider("elsewhere", []string{"other"}, "registry.test"),
		testProvider("example", []string{"*"}, "*.example.com"),
	}})
	s := pull("secure", "registry.test/app", digestA)
	x := te.Explain(s)
	if x.Verdict != "not cached: a decision runs sig" || !x.Providers[0].Applies || x.Providers[1].Applies || x.Providers[2].Applies {
		t.Fatalf("%+v", x)
	}
	if !strings.Contains(x.Providers[1].Why, `namespace "secure" is not in its namespaces (other)`) || !strings.Contains(x.Providers[2].Why, "matches none of its matchImages (*.example.com)") {
		t.Errorf("why: %q / %q", x.Providers[1].Why, x.Providers[2].Why)
	}
	te.Decide(context.Background(), s)
	if x := te.Explain(s); x.Verdict != "allowed: cached by every provider that applies" || x.Providers[0].Cached == nil {
		t.Errorf("%+v", x)
	}
	if te.runners["sig"].calls() != 1 {
		t.Errorf("Explain ran a plugin")
	}
	if x := te.Explain(pull("nobody", "registry.test/app", digestA)); x.Verdict != "allowed: no provider applies" {
		t.Errorf("%+v", x)
	}
}

func TestMetricsRegistered(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, &Config{Hash: "sha256:abc", Providers: []Provider{testProvider("sig", []string{"secure"}, "registry.test")}})
	te.Decide(context.Background(), pull("secure", "registry.test/app", digestA))
	te.Decide(context.Background(), pull("nobody", "registry.test/app", digestA))
	for name, want := range map[string]int{
		"cri_image_proxy_image_policy_decisions_total":         2,
		"cri_image_proxy_image_policy_plugin_duration_seconds": 1,
		"cri_image_proxy_image_policy_cache_entries":           1,
		"cri_image_proxy_image_policy_config_info":             1,
	} {
		if n := testutil.CollectAndCount(te.reg, name); n != want {
			t.Errorf("%s: %d series, want %d", name, n, want)
		}
	}
	want := `
# HELP cri_image_proxy_image_policy_config_info Hash of the image policy configuration in use, as a label.
# TYPE cri_image_proxy_image_policy_config_info gauge
cri_image_proxy_image_policy_config_info{hash="sha256:abc"} 1
`
	if err := testutil.GatherAndCompare(te.reg, strings.NewReader(want), "cri_image_proxy_image_policy_config_info"); err != nil {
		t.Errorf("config info: %v", err)
	}
}

func TestApplies(t *testing.T) {
	t.Parallel()
	te := newTestEngine(t, &Config{DefaultNamespace: "node", Providers: []Provider{
		testProvider("secure-only", []string{"secure"}, "registry.test"),
		testProvider("everywhere-example", []string{"*"}, "*.example.com"),
	}})
	for _, tc := range []struct {
		name            string
		namespace, repo string
		want            bool
	}{
		{"a provider of the namespace matching the repository applies", "secure", "registry.test/app", true},
		{"none applies to another repository of the namespace", "secure", "docker.io/library/nginx", false},
		{"none applies to another namespace", "other", "registry.test/app", false},
		{"a * provider applies to every namespace", "other", "eu.example.com/app", true},
		{"an unknown repository gets every provider of the namespace", "secure", "", true},
		{"a * provider applies to an unknown repository of any namespace", "other", "", true},
		{"no namespace is the default namespace", "", "registry.test/app", false},
		{"no namespace is the default namespace, with its providers", "", "eu.example.com/app", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := te.Applies(tc.namespace, tc.repo); got != tc.want {
				t.Errorf("Applies(%q, %q) = %v, want %v", tc.namespace, tc.repo, got, tc.want)
			}
		})
	}
	for name, f := range te.runners {
		if f.calls() > 0 {
			t.Errorf("%s ran: Applies must run no plugin", name)
		}
	}
}
