package credplugins

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
)

// perTokenRunner is a token plugin whose credential depends on the token it
// is given: the username is the pod the token is bound to, as a registry's
// token exchange would answer per workload. Runs wait at a barrier until
// want runs have started, or the window passes: the window only bounds a
// run that no other will join (the code before the fix), it is not asserted.
type perTokenRunner struct {
	want    int32
	window  time.Duration
	runs    atomic.Int32
	arrived chan struct{}
	once    sync.Once
}

func newPerTokenRunner(want int32) *perTokenRunner {
	return &perTokenRunner{want: want, window: 3 * time.Second, arrived: make(chan struct{})}
}

func (r *perTokenRunner) Run(_ context.Context, req execRequest) (*credentialproviderapi.CredentialProviderResponse, []byte, error) {
	if r.runs.Add(1) >= r.want {
		r.once.Do(func() { close(r.arrived) })
	}
	select {
	case <-r.arrived:
	case <-time.After(r.window):
	}
	// The fake API's tokens read "token-N:sa=...:aud=...:pod=NAME/UID".
	_, pod, _ := strings.Cut(req.ServiceAccountToken, ":pod=")
	pod, _, _ = strings.Cut(pod, "/")
	return &credentialproviderapi.CredentialProviderResponse{CacheKeyType: "Registry", CacheDuration: &metav1.Duration{},
		Auth: map[string]credentialproviderapi.AuthConfig{"registry.test": {Username: pod, Password: pod + "-pw"}}}, nil, nil
}

// Concurrent plugin runs are merged as the kubelet merges them
// (pkg/credentialprovider/plugin/plugin.go, generateSingleFlightKey): per
// image, token hash and annotations. Two pods of one service account never
// share a run, so a plugin answering cacheDuration 0 (KEP-4412's way to keep
// credentials from being shared across pods) gives each pod the credential
// minted for its own token, pulling at once or alone.
func TestEachPodGetsTheCredentialMintedForItsOwnToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	objs := []runtime.Object{
		sa("team-a", "builder", "sa-uid-1", map[string]string{"registry.test/user": "alice"}),
		kpod("team-a", "p1", "pod-1", "builder"), kpod("team-a", "p2", "pod-2", "builder"),
	}
	pods := []*PodRef{{Namespace: "team-a", Name: "p1", UID: "pod-1"}, {Namespace: "team-a", Name: "p2", UID: "pod-2"}}
	firstUser := func(t *testing.T, in *Injector, pod *PodRef) string {
		cands, _, failed := in.Lookup(ctx, "registry.test/team-a/app", pod)
		if len(failed) > 0 || len(cands) != 1 {
			t.Errorf("pod %s: candidates %+v, failed %v", pod.Name, cands, failed)
			return ""
		}
		return cands[0].Credential.Username
	}

	for _, cacheType := range []string{"ServiceAccount", "Token"} {
		t.Run("two pods of one service account pulling at once, cacheType "+cacheType, func(t *testing.T) {
			t.Parallel()
			r := newPerTokenRunner(2)
			in := newTokenInjector(t, newFakeAPI(objs...), tokenProvider(cacheType, true, []string{"registry.test/user"}, nil), r)
			got := make([]string, len(pods))
			var wg sync.WaitGroup
			for i, pod := range pods {
				wg.Add(1)
				go func() { defer wg.Done(); got[i] = firstUser(t, in, pod) }()
			}
			wg.Wait()
			for i, pod := range pods {
				if got[i] != pod.Name {
					t.Errorf("pod %s got the credential minted for %q's token", pod.Name, got[i])
				}
			}
			if n := r.runs.Load(); n != 2 {
				t.Errorf("%d plugin runs for two pods' tokens, want 2", n)
			}
		})
		t.Run("control: each pod pulling alone, cacheType "+cacheType, func(t *testing.T) {
			t.Parallel()
			r := newPerTokenRunner(1)
			in := newTokenInjector(t, newFakeAPI(objs...), tokenProvider(cacheType, true, []string{"registry.test/user"}, nil), r)
			for _, pod := range pods {
				if got := firstUser(t, in, pod); got != pod.Name {
					t.Errorf("pod %s got the credential minted for %q's token", pod.Name, got)
				}
			}
		})
	}

	t.Run("the containers of one pod pulling at once share one run (one token)", func(t *testing.T) {
		t.Parallel()
		api := newFakeAPI(objs...)
		f := &fakeRunner{keyType: "Registry", duration: dur(0), auth: cred}
		in := newTokenInjector(t, api, tokenProvider("ServiceAccount", true, []string{"registry.test/user"}, nil), f)
		in.Lookup(ctx, "registry.test/warm/app", pods[0]) // mints p1's token: every lookup below holds the same one
		f.gate = make(chan struct{})
		const containers = 8
		var wg sync.WaitGroup
		for range containers {
			wg.Add(1)
			go func() { defer wg.Done(); in.Lookup(ctx, "registry.test/team-a/app", pods[0]) }()
		}
		// Each lookup reads the account live, then joins the flight.
		for saReads(api) < 1+containers {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
		close(f.gate)
		wg.Wait()
		if n := f.runs.Load(); n != 2 {
			t.Errorf("%d runs (one to mint the token, then %d concurrent pulls of one pod), want 2", n, containers)
		}
		if n := api.tokens.Load(); n != 1 {
			t.Errorf("%d TokenRequests for one pod, want 1", n)
		}
	})
}

// saReads counts the service account reads the fake API answered.
func saReads(api *fakeAPI) int {
	n := 0
	for _, a := range api.client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "serviceaccounts" {
			n++
		}
	}
	return n
}
