package podtoken_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/metrics"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// tokenAPI is a fake clientset whose TokenRequests answer numbered tokens
// valid for life, or fail while failing is set; it keeps the requests.
type tokenAPI struct {
	client  *fake.Clientset
	clock   *testclock.FakeClock
	life    time.Duration
	minted  atomic.Int32
	failing atomic.Bool
	gate    chan struct{} // when set, each TokenRequest waits for it

	mu       sync.Mutex
	requests []*authenticationv1.TokenRequest
}

func newTokenAPI(objs ...runtime.Object) *tokenAPI {
	f := &tokenAPI{client: fake.NewClientset(objs...), clock: testclock.NewFakeClock(t0), life: time.Hour}
	f.client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		if f.gate != nil {
			<-f.gate
		}
		if f.failing.Load() {
			return true, nil, apierrors.NewServiceUnavailable("etcd is away")
		}
		tr := a.(k8stesting.CreateActionImpl).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		f.mu.Lock()
		f.requests = append(f.requests, tr.DeepCopy())
		f.mu.Unlock()
		tr.Status.Token = fmt.Sprintf("token-%d", f.minted.Add(1))
		tr.Status.ExpirationTimestamp = metav1.NewTime(f.clock.Now().Add(f.life))
		return true, tr, nil
	})
	return f
}

// gets counts the GETs of resource the fake API has answered.
func (f *tokenAPI) gets(resource string) int {
	n := 0
	for _, a := range f.client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

func (f *tokenAPI) source() *podtoken.Source {
	return podtoken.New(podtokentest.API(f.client), "node-a", podtoken.Options{Clock: f.clock, SecretTTL: 30 * time.Second})
}

func testPod(ns, name, uid, sa string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: sa}}
}

func testAccount(ns, name, uid string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
}

func TestPod(t *testing.T) {
	t.Parallel()
	elsewhere := testPod("team-b", "far", "uid-2", "builder")
	elsewhere.Spec.NodeName = "node-b"
	api := newTokenAPI(testPod("team-a", "web", "uid-1", "builder"), elsewhere)
	src := api.source()
	ctx := context.Background()
	for _, tc := range []struct {
		name, ns, pod, uid string
		wantErr            error
		wantNotFound       bool
	}{
		{name: "a pod with the sandbox's UID is returned", ns: "team-a", pod: "web", uid: "uid-1"},
		{name: "a pod of that name with another UID is another pod", ns: "team-a", pod: "web", uid: "uid-old", wantErr: podtoken.ErrPodMismatch},
		{name: "a pod the API does not have is NotFound, wrapped", ns: "team-a", pod: "gone", uid: "uid-9", wantNotFound: true},
		{name: "a pod bound to another node is no pod of this node, whatever the sandbox says", ns: "team-b", pod: "far", uid: "uid-2", wantErr: podtoken.ErrPodNotOnNode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := src.Pod(ctx, tc.ns, tc.pod, tc.uid)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %v, want %v", err, tc.wantErr)
				}
			case tc.wantNotFound:
				if !apierrors.IsNotFound(err) {
					t.Fatalf("got %v, want NotFound", err)
				}
			case err != nil:
				t.Fatal(err)
			case string(p.UID) != tc.uid:
				t.Fatalf("got pod UID %s", p.UID)
			}
			if err != nil && !containsAll(err.Error(), tc.ns+"/"+tc.pod) {
				t.Errorf("the error %q does not name the pod", err)
			}
		})
	}
	t.Run("a service account is read live: a re-created one shows its new UID at once", func(t *testing.T) {
		api.client.CoreV1().ServiceAccounts("team-a").Create(ctx, testAccount("team-a", "builder", "sa-1"), metav1.CreateOptions{})
		sa, err := src.ServiceAccount(ctx, "team-a", "builder")
		if err != nil || sa.UID != "sa-1" {
			t.Fatalf("got %v %v", sa, err)
		}
		api.client.CoreV1().ServiceAccounts("team-a").Delete(ctx, "builder", metav1.DeleteOptions{})
		api.client.CoreV1().ServiceAccounts("team-a").Create(ctx, testAccount("team-a", "builder", "sa-2"), metav1.CreateOptions{})
		if sa, _ := src.ServiceAccount(ctx, "team-a", "builder"); sa == nil || sa.UID != "sa-2" {
			t.Errorf("after re-creation got %v, want UID sa-2", sa)
		}
	})
}

func TestPodInformer(t *testing.T) {
	t.Parallel()
	api := newTokenAPI(testPod("team-a", "web", "uid-1", "builder"))
	src := api.source()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if got := src.PodsOnNode(); got != nil {
		t.Fatalf("before the informer synced, got %d pods, want nil (unknown)", len(got))
	}
	src.Start(ctx)
	defer func() { cancel(); src.Wait() }()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if !src.WaitForSync(wctx) {
		t.Fatal("the informer did not sync")
	}
	if got := src.PodsOnNode(); len(got) != 1 || got[0].Name != "web" {
		t.Fatalf("got %v", got)
	}
	gets := func() int {
		n := 0
		for _, a := range api.client.Actions() {
			if a.GetVerb() == "get" && a.GetResource().Resource == "pods" {
				n++
			}
		}
		return n
	}
	before := gets()
	if _, err := src.Pod(ctx, "team-a", "web", "uid-1"); err != nil {
		t.Fatal(err)
	}
	if gets() != before {
		t.Errorf("a pod the informer holds was read with a GET")
	}
}

func TestToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pod := testPod("team-a", "web", "uid-1", "builder")
	sa := testAccount("team-a", "builder", "sa-1")

	t.Run("the request binds the token to the pod, with the account's UID as precondition", func(t *testing.T) {
		api := newTokenAPI()
		if _, err := api.source().Token(ctx, pod, sa, "registry.test"); err != nil {
			t.Fatal(err)
		}
		r := api.requests[0]
		if r.UID != "sa-1" || len(r.Spec.Audiences) != 1 || r.Spec.Audiences[0] != "registry.test" {
			t.Errorf("got UID %q audiences %v", r.UID, r.Spec.Audiences)
		}
		if b := r.Spec.BoundObjectRef; b == nil || b.Kind != "Pod" || b.APIVersion != "v1" || b.Name != "web" || b.UID != "uid-1" {
			t.Errorf("got bound object %+v", b)
		}
	})
	t.Run("a pod's token is minted once, and again past 80% of its life", func(t *testing.T) {
		api := newTokenAPI()
		src := api.source()
		for range 3 {
			if tok, _ := src.Token(ctx, pod, sa, "registry.test"); tok != "token-1" {
				t.Fatalf("got %q, want token-1", tok)
			}
		}
		api.clock.Step(47 * time.Minute)
		if tok, _ := src.Token(ctx, pod, sa, "registry.test"); tok != "token-1" {
			t.Fatalf("at 78%% of its life got %q, want token-1", tok)
		}
		api.clock.Step(2 * time.Minute)
		if tok, _ := src.Token(ctx, pod, sa, "registry.test"); tok != "token-2" {
			t.Fatalf("at 82%% of its life got %q, want token-2", tok)
		}
	})
	t.Run("a long-lived token is refreshed after 24 hours", func(t *testing.T) {
		api := newTokenAPI()
		api.life = 7 * 24 * time.Hour
		src := api.source()
		src.Token(ctx, pod, sa, "registry.test")
		api.clock.Step(24*time.Hour + time.Second)
		if tok, _ := src.Token(ctx, pod, sa, "registry.test"); tok != "token-2" {
			t.Fatalf("got %q, want token-2", tok)
		}
	})
	t.Run("other audiences, pods and account UIDs get their own tokens", func(t *testing.T) {
		api := newTokenAPI()
		src := api.source()
		src.Token(ctx, pod, sa, "registry.test")
		src.Token(ctx, pod, sa, "other.test")
		src.Token(ctx, testPod("team-a", "api", "uid-2", "builder"), sa, "registry.test")
		src.Token(ctx, pod, testAccount("team-a", "builder", "sa-2"), "registry.test")
		if n := api.minted.Load(); n != 4 {
			t.Errorf("minted %d, want 4", n)
		}
	})
	t.Run("a failed refresh serves the current token while it is valid, then fails naming the account", func(t *testing.T) {
		api := newTokenAPI()
		src := api.source()
		src.Token(ctx, pod, sa, "registry.test")
		api.failing.Store(true)
		api.clock.Step(50 * time.Minute)
		if tok, err := src.Token(ctx, pod, sa, "registry.test"); err != nil || tok != "token-1" {
			t.Fatalf("got %q %v, want the current token", tok, err)
		}
		api.clock.Step(11 * time.Minute)
		_, err := src.Token(ctx, pod, sa, "registry.test")
		if !apierrors.IsServiceUnavailable(err) || !containsAll(err.Error(), "team-a/builder", "registry.test", "web") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("concurrent requests for one pod's token mint one", func(t *testing.T) {
		api := newTokenAPI()
		api.gate = make(chan struct{})
		src := api.source()
		var wg sync.WaitGroup
		toks := make([]string, 16)
		for i := range toks {
			wg.Add(1)
			go func() { defer wg.Done(); toks[i], _ = src.Token(ctx, pod, sa, "registry.test") }()
		}
		time.Sleep(50 * time.Millisecond) // let them gather behind the first flight
		close(api.gate)
		wg.Wait()
		if n := api.minted.Load(); n != 1 {
			t.Errorf("minted %d tokens for 16 concurrent requests, want 1", n)
		}
		for _, tok := range toks {
			if tok != "token-1" {
				t.Fatalf("got %q", tok)
			}
		}
	})
	t.Run("expired tokens are dropped", func(t *testing.T) {
		api := newTokenAPI()
		src := api.source()
		src.Token(ctx, pod, sa, "registry.test")
		src.Token(ctx, testPod("team-a", "api", "uid-2", "builder"), sa, "registry.test")
		if n := src.CachedTokens(); n != 2 {
			t.Fatalf("%d tokens cached, want 2", n)
		}
		api.clock.Step(2 * time.Hour)
		src.DropExpired()
		if n := src.CachedTokens(); n != 0 {
			t.Errorf("%d tokens left after expiry", n)
		}
	})
}

func TestSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pull"}, Type: corev1.SecretTypeDockerConfigJson}
	api := newTokenAPI(sec)
	src := api.source()
	var failing atomic.Bool
	api.client.PrependReactor("get", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, apierrors.NewTooManyRequests("slow down", 1)
		}
		return false, nil, nil
	})
	reads := func() int { return api.gets("secrets") }
	t.Run("a secret is read once per TTL", func(t *testing.T) {
		for range 3 {
			if _, err := src.Secret(ctx, "team-a", "pull"); err != nil {
				t.Fatal(err)
			}
		}
		if n := reads(); n != 1 {
			t.Fatalf("%d reads, want 1", n)
		}
		api.clock.Step(31 * time.Second)
		src.Secret(ctx, "team-a", "pull")
		if n := reads(); n != 2 {
			t.Fatalf("%d reads after the TTL, want 2", n)
		}
	})
	t.Run("a missing secret is remembered for the TTL", func(t *testing.T) {
		before := reads()
		for range 2 {
			if _, err := src.Secret(ctx, "team-a", "nope"); !apierrors.IsNotFound(err) {
				t.Fatalf("got %v, want NotFound", err)
			}
		}
		if n := reads() - before; n != 1 {
			t.Fatalf("%d reads, want 1", n)
		}
	})
	t.Run("other errors are not remembered", func(t *testing.T) {
		failing.Store(true)
		before := reads()
		for range 2 {
			if _, err := src.Secret(ctx, "team-a", "other"); !apierrors.IsTooManyRequests(err) {
				t.Fatalf("got %v", err)
			}
		}
		failing.Store(false)
		if n := reads() - before; n != 2 {
			t.Fatalf("%d reads, want 2", n)
		}
	})
}

func TestRecentServiceAccount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api := newTokenAPI(testAccount("team-a", "builder", "sa-1"))
	src := api.source() // AccountTTL: the default, 5s
	var gate chan struct{}
	var failing atomic.Bool
	api.client.PrependReactor("get", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		if gate != nil {
			<-gate
		}
		if failing.Load() {
			return true, nil, apierrors.NewTooManyRequests("slow down", 1)
		}
		return false, nil, nil
	})
	reads := func() int { return api.gets("serviceaccounts") }
	recreate := func(uid string) {
		api.client.CoreV1().ServiceAccounts("team-a").Delete(ctx, "builder", metav1.DeleteOptions{})
		api.client.CoreV1().ServiceAccounts("team-a").Create(ctx, testAccount("team-a", "builder", uid), metav1.CreateOptions{})
	}
	recentUID := func() string {
		t.Helper()
		sa, err := src.RecentServiceAccount(ctx, "team-a", "builder")
		if err != nil {
			t.Fatal(err)
		}
		return string(sa.UID)
	}

	t.Run("an account is read once per window", func(t *testing.T) {
		before := reads()
		for range 3 {
			if uid := recentUID(); uid != "sa-1" {
				t.Fatalf("UID %s, want sa-1", uid)
			}
		}
		if n := reads() - before; n != 1 {
			t.Fatalf("%d reads, want 1", n)
		}
	})
	t.Run("within the window a re-created account is answered by its old read, and after it by its new UID", func(t *testing.T) {
		recreate("sa-2")
		if uid := recentUID(); uid != "sa-1" {
			t.Fatalf("UID %s within the window, want the kept read's sa-1", uid)
		}
		api.clock.Step(5 * time.Second)
		if uid := recentUID(); uid != "sa-2" {
			t.Fatalf("UID %s after the window, want sa-2", uid)
		}
	})
	t.Run("a live read is never answered from before, and what it finds serves the recent reads", func(t *testing.T) {
		recreate("sa-3")
		if sa, err := src.ServiceAccount(ctx, "team-a", "builder"); err != nil || sa.UID != "sa-3" {
			t.Fatalf("the live read got %v, %v; want UID sa-3", sa, err)
		}
		before := reads()
		if uid := recentUID(); uid != "sa-3" {
			t.Fatalf("UID %s after the live read, want sa-3", uid)
		}
		if n := reads() - before; n != 0 {
			t.Errorf("%d reads, want the live read's answer", n)
		}
	})
	t.Run("a live read that finds the account gone drops the kept read", func(t *testing.T) {
		api.client.CoreV1().ServiceAccounts("team-a").Delete(ctx, "builder", metav1.DeleteOptions{})
		if _, err := src.ServiceAccount(ctx, "team-a", "builder"); !apierrors.IsNotFound(err) {
			t.Fatalf("the live read got %v, want NotFound", err)
		}
		if _, err := src.RecentServiceAccount(ctx, "team-a", "builder"); !apierrors.IsNotFound(err) {
			t.Fatalf("the recent read got %v, want NotFound: the deleted account was answered from before", err)
		}
		api.client.CoreV1().ServiceAccounts("team-a").Create(ctx, testAccount("team-a", "builder", "sa-4"), metav1.CreateOptions{})
	})
	t.Run("errors are not kept", func(t *testing.T) {
		api.clock.Step(5 * time.Second)
		failing.Store(true)
		before := reads()
		for range 2 {
			if _, err := src.RecentServiceAccount(ctx, "team-a", "builder"); !apierrors.IsTooManyRequests(err) {
				t.Fatalf("got %v", err)
			}
		}
		failing.Store(false)
		if n := reads() - before; n != 2 {
			t.Fatalf("%d reads, want 2", n)
		}
	})
	t.Run("concurrent reads share one GET", func(t *testing.T) {
		api.clock.Step(5 * time.Second)
		gate = make(chan struct{})
		defer func() { gate = nil }()
		before := reads()
		var wg sync.WaitGroup
		uids := make([]string, 8)
		for i := range uids {
			wg.Go(func() {
				if sa, err := src.RecentServiceAccount(ctx, "team-a", "builder"); err == nil {
					uids[i] = string(sa.UID)
				}
			})
		}
		// The reactor holds the GET a moment so that the callers join it; one
		// that comes after it is answered by the kept read: one GET either way.
		time.Sleep(50 * time.Millisecond)
		close(gate)
		wg.Wait()
		for _, uid := range uids {
			if uid != "sa-4" {
				t.Fatalf("UIDs %v, want sa-4 each", uids)
			}
		}
		if n := reads() - before; n != 1 {
			t.Errorf("%d reads, want 1", n)
		}
	})
}

// TestRegisterClientMetrics does not depend on being the process's first
// registration (client-go takes one set of metric sinks per process, and
// this test may run again, or after a daemon's): every registry given the
// metrics shows what client-go writes after it was given them.
func TestRegisterClientMetrics(t *testing.T) {
	for _, name := range []string{"a registry shows what client-go writes", "a second registry in the same process shows it too"} {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := podtoken.RegisterClientMetrics(reg); err != nil {
				t.Fatal(err)
			}
			calls := func(code, status string) float64 {
				return sample(t, reg, "rest_client_exec_plugin_call_total", map[string]string{"code": code, "call_status": status})
			}
			requests := func() float64 {
				return sample(t, reg, "rest_client_requests_total", map[string]string{"code": "201", "method": "POST", "host": "127.0.0.1:6443"})
			}
			rotations := func() float64 { return sample(t, reg, "rest_client_exec_plugin_certificate_rotation_age", nil) }
			ok, failed, posts, rotated := calls("0", "no_error"), calls("1", "plugin_execution_error"), requests(), rotations()

			metrics.ExecPluginCalls.Increment(0, "no_error")
			metrics.ExecPluginCalls.Increment(1, "plugin_execution_error")
			metrics.RequestResult.Increment(context.Background(), "201", "POST", "127.0.0.1:6443")
			metrics.ClientCertRotationAge.Observe(time.Hour)

			for what, d := range map[string]float64{
				"exec plugin calls that succeeded": calls("0", "no_error") - ok,
				"exec plugin calls that failed":    calls("1", "plugin_execution_error") - failed,
				"requests":                         requests() - posts,
				"certificate rotations":            rotations() - rotated,
			} {
				if d != 1 {
					t.Errorf("%s went up by %v, want 1", what, d)
				}
			}

			exp := t0.Add(time.Hour)
			metrics.ClientCertExpiry.Set(&exp)
			if v := sample(t, reg, "rest_client_exec_plugin_ttl_seconds", nil); math.IsNaN(v) {
				t.Error("rest_client_exec_plugin_ttl_seconds is NaN with a certificate expiry set")
			}
			metrics.ClientCertExpiry.Set(nil)
			if v := sample(t, reg, "rest_client_exec_plugin_ttl_seconds", nil); !math.IsNaN(v) {
				t.Errorf("rest_client_exec_plugin_ttl_seconds = %v without a certificate, want NaN", v)
			}
		})
	}
}

// sample gathers reg and returns the value of the series of name with
// exactly labels (a histogram's sample count), 0 when there is none.
// A wrong name reads 0, which fails the callers' checks of a rise.
func sample(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
		return 0
	}
	return 0 // a vector without series is not gathered
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
