package credplugins

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testclock "k8s.io/utils/clock/testing"

	"github.com/cri-image-proxy/cri-image-proxy/execplugin"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken"
	"github.com/cri-image-proxy/cri-image-proxy/podtoken/podtokentest"
	"github.com/cri-image-proxy/cri-image-proxy/test/testkit"
)

// fakeAPI is a fake clientset with pods and service accounts, whose
// TokenRequests answer a token naming what it was bound to.
type fakeAPI struct {
	client *fake.Clientset
	tokens atomic.Int32
}

func newFakeAPI(objs ...runtime.Object) *fakeAPI {
	f := &fakeAPI{client: fake.NewClientset(objs...)}
	f.client.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tr := a.(k8stesting.CreateActionImpl).GetObject().(*authenticationv1.TokenRequest)
		n := f.tokens.Add(1)
		tr = tr.DeepCopy()
		tr.Status.Token = fmt.Sprintf("token-%d:sa=%s:aud=%s:pod=%s/%s", n, a.(k8stesting.CreateActionImpl).Name, strings.Join(tr.Spec.Audiences, ","), tr.Spec.BoundObjectRef.Name, tr.Spec.BoundObjectRef.UID)
		tr.Status.ExpirationTimestamp = metav1.NewTime(time.Now().Add(time.Hour))
		return true, tr, nil
	})
	return f
}

func sa(ns, name, uid string, ann map[string]string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: ann}}
}

func kpod(ns, name, uid, saName string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{ServiceAccountName: saName, NodeName: "node"}}
}

func tokenProvider(cacheType string, require bool, required, optional []string) Provider {
	return Provider{Name: "tp", MatchImages: []string{"registry.test"}, DefaultCacheDuration: time.Hour,
		APIVersion: "credentialprovider.kubelet.k8s.io/v1",
		TokenAttributes: &TokenAttributes{ServiceAccountTokenAudience: "registry.test", CacheType: cacheType, RequireServiceAccount: &require,
			RequiredServiceAccountAnnotationKeys: required, OptionalServiceAccountAnnotationKeys: optional}}
}

func newTokenInjector(t testing.TB, api *fakeAPI, p Provider, r runner) *Injector {
	t.Helper()
	src := podtoken.New(podtokentest.API(api.client), "node", podtoken.Options{})
	in, err := New(&Config{Hash: "h", Providers: []Provider{p}}, Options{Clock: testclock.NewFakeClock(t0), Identity: src})
	if err != nil {
		t.Fatal(err)
	}
	in.plugins()[0].Runner = r
	return in
}

func TestTokenProviders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	objs := []runtime.Object{
		sa("team-a", "builder", "sa-uid-1", map[string]string{"registry.test/user": "alice", "registry.test/tenant": "a", "unrelated": "x"}),
		sa("team-a", "plain", "sa-uid-2", nil),
		sa("team-b", "builder", "sa-uid-3", map[string]string{"registry.test/user": "bob"}),
		kpod("team-a", "p1", "pod-1", "builder"), kpod("team-a", "p2", "pod-2", "builder"),
		kpod("team-a", "p3", "pod-3", "plain"), kpod("team-a", "nosa", "pod-4", ""),
		kpod("team-b", "q1", "pod-5", "builder"),
	}
	ref := func(ns, name, uid string) *PodRef { return &PodRef{Namespace: ns, Name: name, UID: uid} }

	t.Run("the plugin gets a token for its audience, bound to the pod, and the annotations it asks for", func(t *testing.T) {
		api := newFakeAPI(objs...)
		r := &fakeRunner{keyType: "Registry", auth: cred}
		in := newTokenInjector(t, api, tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, []string{"registry.test/tenant", "registry.test/absent"}), r)
		cands, answers, failed := in.Lookup(ctx, "registry.test/app", ref("team-a", "p1", "pod-1"))
		if len(failed) > 0 || len(cands) != 1 {
			t.Fatalf("candidates %v, failed %v", cands, failed)
		}
		if r.last.ServiceAccountToken != "token-1:sa=builder:aud=registry.test:pod=p1/pod-1" {
			t.Errorf("token %q", r.last.ServiceAccountToken)
		}
		want := map[string]string{"registry.test/user": "alice", "registry.test/tenant": "a"}
		if fmt.Sprint(r.last.ServiceAccountAnnotations) != fmt.Sprint(want) {
			t.Errorf("annotations %v, want %v", r.last.ServiceAccountAnnotations, want)
		}
		if a := answers[0].ServiceAccount; a == nil || a.Namespace != "team-a" || a.Name != "builder" || a.UID != "sa-uid-1" || cands[0].ServiceAccount != a {
			t.Errorf("service account of the answer %+v", a)
		}
	})

	for _, tc := range []struct {
		name    string
		require bool
		pod     *PodRef
		wantRun bool
		wantErr error
	}{
		{"a pod without service account, one required: not run", true, ref("team-a", "nosa", "pod-4"), false, ErrNoServiceAccountCredential},
		{"a pod without service account, none required: run without a token", false, ref("team-a", "nosa", "pod-4"), true, nil},
		{"no pod at all (crictl), one required: not run", true, nil, false, ErrNoServiceAccountCredential},
		{"a required annotation missing: not run", true, ref("team-a", "p3", "pod-3"), false, ErrNoServiceAccountCredential},
		{"a pod whose UID changed: refused", true, ref("team-a", "p1", "pod-1-old"), false, podtoken.ErrPodMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeRunner{keyType: "Registry", auth: cred}
			in := newTokenInjector(t, newFakeAPI(objs...), tokenProvider("ServiceAccount", tc.require, []string{"registry.test/user"}, nil), r)
			_, answers, failed := in.Lookup(ctx, "registry.test/app", tc.pod)
			if ran := r.runs.Load() == 1; ran != tc.wantRun {
				t.Errorf("ran %v, want %v", ran, tc.wantRun)
			}
			if tc.wantErr != nil && (len(failed) != 1 || !errors.Is(failed[0].Err, tc.wantErr)) {
				t.Errorf("failed %v, want %v", failed, tc.wantErr)
			}
			if tc.wantRun && (len(answers) != 1 || answers[0].ServiceAccount != nil || r.last.ServiceAccountToken != "") {
				t.Errorf("a run without service account: answers %+v, token %q", answers, r.last.ServiceAccountToken)
			}
		})
	}

	t.Run("cacheType ServiceAccount: one run per service account, again when it is re-created", func(t *testing.T) {
		api := newFakeAPI(objs...)
		r := &fakeRunner{keyType: "Registry", auth: cred}
		in := newTokenInjector(t, api, tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, nil), r)
		in.Lookup(ctx, "registry.test/app", ref("team-a", "p1", "pod-1"))
		in.Lookup(ctx, "registry.test/app", ref("team-a", "p2", "pod-2"))
		if n := r.runs.Load(); n != 1 {
			t.Errorf("two pods of one service account ran the plugin %d times, want 1", n)
		}
		in.Lookup(ctx, "registry.test/app", ref("team-b", "q1", "pod-5"))
		if n := r.runs.Load(); n != 2 {
			t.Errorf("another service account: %d runs, want 2", n)
		}
		api.client.CoreV1().ServiceAccounts("team-a").Delete(ctx, "builder", metav1.DeleteOptions{})
		api.client.CoreV1().ServiceAccounts("team-a").Create(ctx, sa("team-a", "builder", "sa-uid-new", map[string]string{"registry.test/user": "alice"}), metav1.CreateOptions{})
		in.Lookup(ctx, "registry.test/app", ref("team-a", "p1", "pod-1"))
		if n := r.runs.Load(); n != 3 {
			t.Errorf("a re-created service account: %d runs, want 3", n)
		}
	})

	t.Run("cacheType Token: one run per token; a pod's token is minted once", func(t *testing.T) {
		api := newFakeAPI(objs...)
		r := &fakeRunner{keyType: "Registry", auth: cred}
		in := newTokenInjector(t, api, tokenProvider("Token", true, nil, nil), r)
		in.Lookup(ctx, "registry.test/app", ref("team-a", "p1", "pod-1"))
		in.Lookup(ctx, "registry.test/other", ref("team-a", "p1", "pod-1"))
		in.Lookup(ctx, "registry.test/app", ref("team-a", "p2", "pod-2"))
		if n := r.runs.Load(); n != 2 {
			t.Errorf("%d runs, want 2 (one per pod's token; the second image of p1 hits the registry-wide answer)", n)
		}
		if n := api.tokens.Load(); n != 2 {
			t.Errorf("%d TokenRequests for 2 pods, want 2", n)
		}
	})

	t.Run("a plugin echoing the token is refused unless cached per token", func(t *testing.T) {
		for cacheType, wantOK := range map[string]bool{"ServiceAccount": false, "Token": true} {
			r := &fakeRunner{keyType: "Registry", echo: true}
			in := newTokenInjector(t, newFakeAPI(objs...), tokenProvider(cacheType, true, nil, nil), r)
			cands, _, failed := in.Lookup(ctx, "registry.test/app", ref("team-a", "p1", "pod-1"))
			if ok := len(failed) == 0 && len(cands) == 1; ok != wantOK {
				t.Errorf("cacheType %s: candidates %v, failed %v", cacheType, cands, failed)
			}
			if !wantOK && !errors.Is(failed[0].Err, ErrInvalidResponse) {
				t.Errorf("cacheType %s: %v", cacheType, failed[0].Err)
			}
		}
	})

	t.Run("a token provider without an API is a configuration error", func(t *testing.T) {
		_, err := New(&Config{Providers: []Provider{tokenProvider("Token", true, nil, nil)}}, Options{})
		if err == nil || !strings.Contains(err.Error(), "needs the Kubernetes API") {
			t.Errorf("got %v", err)
		}
	})
}

func TestPluginStderrNeverLogsASecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	// A chatty plugin: it prints the token it was given, the password it
	// answers, a bearer header and a JSON pair to stderr, then a lot more.
	testkit.WritePlugin(t, dir, "chatty", `req=$(cat)
v=$(printf '%s' "$req" | sed -n 's/.*"apiVersion":"\([^"]*\)".*/\1/p')
tok=$(printf '%s' "$req" | sed -n 's/.*"serviceAccountToken":"\([^"]*\)".*/\1/p')
echo "debug: got token $tok" >&2
echo "debug: answering password hunter2-pw" >&2
echo "debug: Authorization: Bearer abc.def-ghi" >&2
echo 'debug: {"password": "other-pw-123"}' >&2
echo "debug: eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln" >&2
head -c 70000 /dev/zero | tr '\0' 'x' >&2
printf '{"apiVersion":"%s","kind":"CredentialProviderResponse","cacheKeyType":"Registry","auth":{"registry.test":{"username":"u","password":"hunter2-pw"}}}' "$v"
`)
	api := newFakeAPI(sa("team-a", "builder", "sa-uid-1", map[string]string{"registry.test/user": "alice"}), kpod("team-a", "p1", "pod-1", "builder"))
	p := tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, nil)
	p.Name = "chatty"
	src := podtoken.New(podtokentest.API(api.client), "node", podtoken.Options{})
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var logs strings.Builder
		in, err := New(&Config{Hash: "h", Providers: []Provider{p}}, Options{Clock: testclock.NewFakeClock(t0), Identity: src,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level}))})
		if err != nil {
			t.Fatal(err)
		}
		in.plugins()[0].Runner = newExecPlugin(p, dir, time.Minute)
		_, answers, failed := in.Lookup(ctx, "registry.test/app", &PodRef{Namespace: "team-a", Name: "p1", UID: "pod-1"})
		if len(failed) > 0 || len(answers) != 1 {
			t.Fatalf("answers %v, failed %v", answers, failed)
		}
		out := logs.String()
		for _, secret := range []string{"token-1", "hunter2-pw", "abc.def-ghi", "other-pw-123", "eyJhbGciOiJSUzI1NiJ9"} {
			if strings.Contains(out, secret) {
				t.Errorf("at level %v the log holds %q:\n%.2000s", level, secret, out)
			}
		}
		switch {
		case level == slog.LevelInfo && strings.Contains(out, "stderr"):
			t.Errorf("a plugin's stderr is logged above debug level:\n%.2000s", out)
		case level == slog.LevelDebug && (!strings.Contains(out, "debug: got token [redacted]") || len(out) > 4*execplugin.MaxLoggedStderr):
			t.Errorf("at debug level, want the stderr masked and capped (%d bytes):\n%.2000s", len(out), out)
		}
	}
}

func TestServiceAccountMayPull(t *testing.T) {
	t.Parallel()
	src := podtoken.New(podtokentest.API(newFakeAPI().client), "node", podtoken.Options{})
	in, err := New(&Config{Hash: "h", Providers: []Provider{
		tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, []string{"registry.test/tenant"}),
		{Name: "static", MatchImages: []string{"other.test"}, APIVersion: "credentialprovider.kubelet.k8s.io/v1"},
	}}, Options{Identity: src})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		image string
		ann   map[string]string
		want  bool
	}{
		{"an account with the required annotation, for an image the token plugin matches, may pull", "registry.test/team/app", map[string]string{"registry.test/user": "alice"}, true},
		{"an account whose required annotation was removed may not", "registry.test/team/app", map[string]string{"registry.test/tenant": "a"}, false},
		{"an image no token plugin matches may not be pulled by an account", "elsewhere.test/team/app", map[string]string{"registry.test/user": "alice"}, false},
		{"a plugin without token attributes does not count", "other.test/team/app", map[string]string{"registry.test/user": "alice"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, why := in.ServiceAccountMayPull(tc.image, sa("ns", "builder", "uid", tc.ann)); got != tc.want {
				t.Errorf("got %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}
