package ensure_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// The private image's digest, preloaded under other names.
const (
	preloadedTag  = "registry.test/team-a/app:node" // another tag of the private image's repository
	preloadedRepo = "registry.test/base/app:node"   // another repository
)

// TestTheNamesListedBeforeAPullStayPreloaded: the first record of an image
// that was on the node keeps the names the runtime listed it under before
// the pull; the names the pull itself, or another pull in flight, may have
// added are left out.
func TestTheNamesListedBeforeAPullStayPreloaded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("its other tags and repositories; not the pulled name, nor the digests of its repository", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		for _, name := range []string{preloadedTag, preloadedRepo, "registry.test/team-a/app@" + manifestDigest(refApp)} {
			s.node.preload(name, refApp)
		}
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A's pull: %s", got)
		}
		if got, want := s.store.Preloaded(refApp), []string{preloadedRepo, preloadedTag}; !slices.Equal(got, want) {
			t.Errorf("preloaded names %q, want %q", got, want)
		}
		if got := s.startAs(podB, "registry.test/team-a/app@"+manifestDigest(refApp), "Never", false); got != errNeverPull {
			t.Errorf("B by the repository's digest (which A's pull would have added): %s, want %s", got, errNeverPull)
		}
	})

	t.Run("an image that came through the proxy first has none", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.start(podA, private, "IfNotPresent")
		s.node.preload(preloadedTag, refApp)
		s.start(podA2, private, "Always")
		if got := s.store.Preloaded(refApp); got != nil {
			t.Errorf("preloaded names %q", got)
		}
	})

	t.Run("a name another pull in flight may have added is left out", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.preload(preloadedTag, refApp)
		// C's pull of the same digest under another repository: the
		// runtime has given the image its name, the pull has not answered.
		named, release, done := make(chan struct{}), make(chan struct{}), make(chan error)
		go func() {
			_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: preloadedRepo}, Auth: cred("carol:c-pw"), SandboxConfig: pod{uid: "c1"}.sandbox()},
				func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					s.node.put(preloadedRepo, refApp)
					close(named)
					<-release
					return &runtimeapi.PullImageResponse{ImageRef: refApp}, nil
				})
			done <- err
		}()
		<-named
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A's pull: %s", got)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got, want := s.store.Preloaded(refApp), []string{preloadedTag}; !slices.Equal(got, want) {
			t.Errorf("preloaded names %q, want %q", got, want)
		}
		if got := s.start(podB, preloadedRepo, "Never"); got != errNeverPull {
			t.Errorf("B by C's name: %s, want %s", got, errNeverPull)
		}
	})

	t.Run("a pull that failed but left its image keeps them too", func(t *testing.T) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.preload(preloadedTag, refApp)
		_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("bob:wrong"), SandboxConfig: podBWrong.sandbox()},
			func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				s.node.put(private, refApp)
				return nil, errors.New("cut off")
			})
		if err == nil {
			t.Fatal("the pull succeeded")
		}
		if got, want := s.store.Preloaded(refApp), []string{preloadedTag}; !slices.Equal(got, want) {
			t.Errorf("preloaded names %q, want %q", got, want)
		}
		if got := s.start(podB, preloadedTag, "Never"); got != running {
			t.Errorf("B by the preloaded tag: %s", got)
		}
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("B by the name the failed pull left: %s", got)
		}
	})
}

// TestAPreloadedNameSurvivesAReopenedDatabase: the daemon restarted on its
// database file decides a preloaded name as before, by name and by ID.
func TestAPreloadedNameSurvivesAReopenedDatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ensure.db")
	open := func() *records.Store {
		st, err := records.Open(path, records.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	first := open()
	s.store = first
	s.restart(t, decision.NeverVerifyPreloadedImages)
	s.node.preload(preloadedTag, refApp)
	s.node.preload(preloadedRepo, refApp)
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A's pull: %s", got)
	}
	first.Close()
	s.store = open()
	s.restart(t, decision.NeverVerifyPreloadedImages)
	for _, tc := range []struct {
		image string
		byID  bool
		want  kubeletResult
	}{
		{preloadedTag, false, running},
		{preloadedTag, true, running},
		{preloadedRepo, true, running},
		{private, false, errNeverPull},
	} {
		if got := s.startAs(podB, tc.image, "Never", tc.byID); got != tc.want {
			t.Errorf("after a restart, B's Never pod of %s (by ID %v): %s, want %s", tc.image, tc.byID, got, tc.want)
		}
	}
	e, err := s.guard.Explain(context.Background(), preloadedTag, podB.uid)
	if err != nil || e.NeedsVerification || !slices.Equal(e.Preloaded, []string{preloadedRepo, preloadedTag}) {
		t.Errorf("explain: %+v, %v", e, err)
	}
}

// TestPreloadedNamesAndSharedLayers: the layer checks and the preloaded
// names agree. An image that came around the proxy holding another
// tenant's private layer was never free, so a pull of it with credentials
// gives it no preloaded names; an image with preloaded names is free by
// them, so its layers are public, and another image sharing them that came
// around the proxy is no other tenant's content.
func TestPreloadedNamesAndSharedLayers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("an image that came around the proxy with a private layer gets no preloaded names from a pull with credentials", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t) // A's secret image holds lSecret, private
		s.clock.Step(1)
		s.node.preload(around, refAround) // holds lSecret, around the proxy
		const aroundByBob = "registry.test/team-b/around:bob"
		s.node.serve(aroundByBob, refAround, "bob:b-pw")
		s.node.serveBytes("registry.test/team-b/around", lSecret)
		if got := s.start(podBOwn, aroundByBob, "IfNotPresent"); got != running {
			t.Fatalf("B's pull with its own credential, the layer proven: %s", got)
		}
		if got := s.store.Preloaded(refAround); got != nil {
			t.Errorf("preloaded names %q for an image that came with another tenant's private layer", got)
		}
		if got := s.start(podC, around, "Never"); got != errNeverPull {
			t.Errorf("C by the name it came around the proxy under: %s, want %s", got, errNeverPull)
		}
	})

	t.Run("the layers of an image with preloaded names are public", func(t *testing.T) {
		t.Parallel()
		const (
			other    = "registry.test/team-c/other:v1"
			refOther = "sha256:abababababababababababababababababababababababababababababababab"
		)
		lShared := digest.FromString("a layer the preloaded image brought")
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.withLayers(refApp, lShared)
		s.node.withLayers(refOther, lShared)
		s.node.preload(preloadedTag, refApp)
		if err := s.guard.ObserveLayers(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A's pull: %s", got)
		}
		if got := s.store.Preloaded(refApp); len(got) == 0 {
			t.Fatalf("no preloaded names")
		}
		s.clock.Step(1)
		s.node.preload(other, refOther) // around the proxy, after A's pull
		if got := s.start(podC, other, "Never"); got != running {
			t.Errorf("C's image sharing only a preloaded image's layer: %s, want %s", got, running)
		}
		if got := s.start(podC, preloadedTag, "Never"); got != running {
			t.Errorf("C by the preloaded tag: %s", got)
		}
	})
}
