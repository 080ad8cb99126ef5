package ensure_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/opencontainers/go-digest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Images of the layer tests: A's private image, and images of B's (own
// repositories, where B's registry answers what B likes) naming its layers.
const (
	secret    = "registry.test/team-a/secret:v1"
	refSecret = "sha256:5555555555555555555555555555555555555555555555555555555555555555"
	forged    = "registry.test/team-b/forged:v1" // B's own config, A's diff_ids, no bytes of them
	refForged = "sha256:6666666666666666666666666666666666666666666666666666666666666666"
	bCopy     = "registry.test/team-b/copy:v1" // B's own config, A's diff_ids, and their bytes
	refCopy   = "sha256:7777777777777777777777777777777777777777777777777777777777777777"
	bCopy2    = "registry.test/team-b/copy:v2"
	refCopy2  = "sha256:7878787878787878787878787878787878787878787878787878787878787878"
	base      = "registry.test/library/base:node" // preloaded
	refBase   = "sha256:8888888888888888888888888888888888888888888888888888888888888888"
	around    = "registry.test/team-b/around:v1" // put on the node around the proxy
	refAround = "sha256:9999999999999999999999999999999999999999999999999999999999999999"
)

var (
	lBase   = digest.FromString("the base layer")
	lSecret = digest.FromString("A's secret layer")
	lOwn    = digest.FromString("a layer of B's own")
	podC    = pod{uid: "c1"}
)

// layerSetup is a checked guard with A's private image pulled by A, B's
// images served by B's repositories (holding no layer bytes unless a test
// says so), and base preloaded and seen before A's pull.
func layerSetup(t *testing.T) *setup {
	t.Helper()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.withLayers(refCopy, lBase, lSecret)
	n.withLayers(refCopy2, lSecret, lOwn)
	n.withLayers(refBase, lBase)
	n.withLayers(refAround, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.serve(bCopy, refCopy, "bob:b-pw")
	n.serve(bCopy2, refCopy2, "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{} // B's registry holds no bytes; A's is never asked for a proof
	n.serveBytes("registry.test/team-b/copy", lOwn)
	n.preload(base, refBase)
	if err := s.guard.ObserveLayers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.start(podA, secret, "IfNotPresent"); got != running {
		t.Fatalf("A's pull of its private image: %s", got)
	}
	return s
}

// TestNoDigestIsAKeyToAnotherTenantsLayers: whatever digests B learns of
// A's private image, no container of B's sees its content unless B's
// registry proved it by its bytes.
func TestNoDigestIsAKeyToAnotherTenantsLayers(t *testing.T) {
	t.Parallel()
	t.Run("a config of B's own naming A's private layers: B's pull is refused, nothing is recorded for B, C cannot run it", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
			t.Errorf("B: %s, want %s", got, errImagePull)
		}
		if got := s.start(podB, forged, "IfNotPresent"); got != errImagePull {
			t.Errorf("B anonymously: %s, want %s", got, errImagePull)
		}
		if s.node.layerProofs() == 0 {
			t.Errorf("no layer was asked for by its bytes")
		}
		// The runtime pulled beside the check: what it left is tracked, and
		// hidden from every pod.
		trackedUnverified(t, s.store, refForged)
		if got := s.start(podC, forged, "Never"); got != errNeverPull {
			t.Errorf("C: %s, want %s", got, errNeverPull)
		}
		if !strings.Contains(s.log.String(), "must be proven by their bytes") {
			t.Errorf("the decision log does not say which layers must be proven")
		}
	})
	t.Run("a legitimate copy whose repository serves the bytes runs after one proof; the repository's next image sharing the layer needs none", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.node.serveBytes("registry.test/team-b/copy", lBase, lSecret)
		if got := s.start(podBOwn, bCopy, "IfNotPresent"); got != running {
			t.Fatalf("B's copy: %s\n%s", got, s.log.String())
		}
		if n := s.node.layerProofs(); n != 1 {
			t.Errorf("%d layers proven, want 1 (the base layer is public: preloaded before)", n)
		}
		if got := s.start(pod{uid: "b5", creds: podBOwn.creds}, bCopy2, "IfNotPresent"); got != running {
			t.Fatalf("B's second image: %s", got)
		}
		if n := s.node.layerProofs(); n != 1 {
			t.Errorf("%d layers proven, want still 1: the repository vouched for the shared layer", n)
		}
	})
	t.Run("a layer of an image preloaded before the private one is public: no proof", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.node.withLayers(refForged, lBase)
		if got := s.start(podBOwn, forged, "IfNotPresent"); got != running {
			t.Fatalf("B: %s", got)
		}
		if n := s.node.layerProofs(); n != 0 {
			t.Errorf("%d layers proven, want none", n)
		}
	})
	t.Run("an anonymous record of the layer makes it public only where the repository proved it", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.node.withLayers(refForged, lSecret)
		if got := s.start(podB, forged, "IfNotPresent"); got != errImagePull {
			t.Fatalf("B anonymously: %s, want %s", got, errImagePull)
		}
		s.node.serveBytes("registry.test/team-b/forged", lSecret)
		if got := s.start(podB, forged, "IfNotPresent"); got != running {
			t.Fatalf("B anonymously, the bytes served: %s", got)
		}
		// Proven public: anyone can fetch it there, so it no longer needs
		// proving elsewhere.
		proofs := s.node.layerProofs()
		s.node.withLayers(refCopy2, lSecret)
		if got := s.start(podBOwn, bCopy2, "IfNotPresent"); got != running || s.node.layerProofs() != proofs {
			t.Errorf("B's other image: %s, %d more proofs; want it running with none", got, s.node.layerProofs()-proofs)
		}
	})
	t.Run("a layer another tenant's pull unpacks while B's runtime pulls is proven, and the image B's pull left is tracked", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		n := s.node
		n.withLayers(refSecret, lSecret)
		n.withLayers(refForged, lSecret)
		n.serve(secret, refSecret, "alice:a-pw")
		n.serve(forged, refForged, "bob:b-pw")
		n.holds = map[string]map[digest.Digest]bool{}
		// A's registry serves its bytes: A proves them if B's pull in flight
		// makes them private to A's.
		n.serveBytes("registry.test/team-a/secret", lSecret)
		// A's pull of its private image runs while B's runtime pulls: the
		// runtime unpacks A's layer first, and builds B's image from it.
		aPulled, aDone := make(chan struct{}), make(chan kubeletResult, 1)
		var once sync.Once
		n.afterPull = func(id string) {
			if id == refSecret {
				once.Do(func() { close(aPulled) })
			}
		}
		n.duringPull = func() {
			n.mu.Lock()
			n.duringPull = nil
			n.mu.Unlock()
			go func() { aDone <- s.start(podA, secret, "IfNotPresent") }()
			<-aPulled
		}
		if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
			t.Fatalf("B: %s, want %s", got, errImagePull)
		}
		if got := <-aDone; got != running {
			t.Errorf("A: %s", got)
		}
		trackedUnverified(t, s.store, refForged)
	})
}

// TestAnImageThatCameAroundTheProxyWithPrivateLayers: an image with no
// record that holds a layer private before the proxy first saw it is
// refused by every name and by ID, and hidden from then on; one the node
// held before is preloaded.
func TestAnImageThatCameAroundTheProxyWithPrivateLayers(t *testing.T) {
	t.Parallel()
	t.Run("refused at create by name and by ID, then hidden", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.clock.Step(1)
		s.node.preload(around, refAround)
		if got := s.start(podC, around, "Never"); got != deniedCreate {
			t.Errorf("C by name: %s, want %s", got, deniedCreate)
		}
		if got := s.start(podC, around, "Never"); got != errNeverPull {
			t.Errorf("C again: %s, want %s (hidden)", got, errNeverPull)
		}
		_, err := s.guard.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
			PodSandboxId: "sandbox-c1", SandboxConfig: podC.sandbox(),
			Config: &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refAround}},
		}, s.node.CreateContainer)
		if err == nil {
			t.Errorf("C by ID: created")
		}
	})
	t.Run("the base image preloaded before the private pull still runs", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		if got := s.start(podC, base, "Never"); got != running {
			t.Errorf("C: %s, want %s", got, running)
		}
	})
	t.Run("a runtime that gives no config: an image never seen is refused while private layers are on the node", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.node.noConfig = true
		s.node.preload(around, refAround)
		if got := s.start(podC, around, "Never"); got != deniedCreate {
			t.Errorf("C: %s, want %s", got, deniedCreate)
		}
	})
	t.Run("garbage collection finds it and tracks it before any create", func(t *testing.T) {
		t.Parallel()
		s := layerSetup(t)
		s.clock.Step(1)
		s.node.preload(around, refAround)
		if _, _, err := s.guard.GC(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := s.start(podC, around, "Never"); got != errNeverPull {
			t.Errorf("C: %s, want %s (hidden)", got, errNeverPull)
		}
	})
}
