package ensure_test

// Holes found attacking the settle change (every end of a pull settled in
// one place): each test is what the guard must do and, on h/attack, does
// not.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

// create puts image on the node as id the way containerd's pull does: the
// tag moves to id (off the image it named before), and the repo digest
// the pull fetched is listed, and resolved, as a name of id.
func (n *fakeNode) create(image, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ref := norm(image)
	if old := n.local[ref]; old != nil && old.Id != id {
		old.RepoTags = slices.DeleteFunc(old.RepoTags, func(t string) bool { return t == ref })
	}
	if img := n.local[ref]; img == nil || img.Id != id {
		n.store(ref, id)
	}
	named, _ := reference.ParseNormalizedNamed(ref)
	dref := named.Name() + "@" + manifestDigest(id)
	img := n.local[id]
	if !slices.Contains(img.RepoDigests, dref) {
		img.RepoDigests = append(img.RepoDigests, dref)
	}
	n.local[dref] = img
}

// untag takes image's tag off id, as containerd does when a pull moves the
// tag to another image (the fake's PullImage leaves it listed).
func (n *fakeNode) untag(image, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ref := norm(image)
	if img := n.local[id]; img != nil {
		img.RepoTags = slices.DeleteFunc(img.RepoTags, func(t string) bool { return t == ref })
	}
}

// stoppedPull is B's pull of image that the registry refuses while the
// runtime pulls: the proxy stops the runtime's pull, which has not
// answered yet (a cut pull: its intent stays).
func stoppedPull(t *testing.T, s *setup, image string, p pod) {
	t.Helper()
	gate := make(chan struct{})
	s.node.mu.Lock()
	s.node.checkGate = gate
	s.node.mu.Unlock()
	_, err := s.guard.PullImage(context.Background(), pullOf(image, p), func(ctx context.Context, _ *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		close(gate)  // the refusal comes while the runtime pulls
		<-ctx.Done() // the proxy stops the runtime's pull
		return nil, status.Error(codes.Canceled, "context canceled")
	})
	wantRefused(t, err)
	s.node.mu.Lock()
	s.node.checkGate = nil
	s.node.mu.Unlock()
}

// TestAPullTheRuntimeRefusedBeforeTheRegistryDidLeavesNoIntent: when the
// runtime answered a pull with its own error (not found, unauthorized)
// and the registry check refused afterwards, the runtime's last word is
// known: the pull is refused, not cut, and its intent goes, as for any
// refused pull that left nothing. Kept, it would count as a pull in
// flight of the repository for ever (the tag may never exist, so no GC
// run finds it and no pull of it succeeds; it survives restarts), and
// every preloaded image of that repository would need verification by
// every pod: one pod of tenant B with a junk pull secret naming a
// non-existent tag takes the preloaded images of any repository away
// from every tenant.
func TestAPullTheRuntimeRefusedBeforeTheRegistryDidLeavesNoIntent(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.node.preload(base, refBase)
	if err := s.guard.ObserveLayers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.start(podC, base, "Never"); got != running {
		t.Fatalf("C, the preloaded image, before: %s", got)
	}
	gate := make(chan struct{})
	s.node.mu.Lock()
	s.node.checkGate = gate
	s.node.mu.Unlock()
	var answered atomic.Bool
	_, err := s.guard.PullImage(context.Background(), pullOf("registry.test/library/base:no-such-tag", podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		resp, err := s.node.PullImage(ctx, r) // NotFound: the runtime's own answer
		answered.Store(err != nil)
		close(gate) // the registry's refusal comes after it
		return resp, err
	})
	wantRefused(t, err)
	if !answered.Load() {
		t.Fatal("the runtime did not answer with its own error")
	}
	if intents, err := s.store.Intents(); err != nil || len(intents) != 0 {
		t.Errorf("intents after a pull the runtime and the registry both refused: %v, %v; want none", intents, err)
	}
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.start(podC, base, "Never"); got != running {
		t.Errorf("C, the preloaded image, after B's refused pull of another tag of its repository and a GC run: %s, want %s", got, running)
	}
}

// TestAPullCutBeforeTheRuntimeWasAskedLeavesTheNodeAsItWas: B pulls a
// preloaded name (Always), and B's pod goes away while the registry check
// runs (the kubelet cancels the pull): the image is on the node, so the
// runtime is never asked. settle's own rule: the runtime's last word on
// every try is known (it was never asked), so the intent goes. It is kept
// instead (endCut is a cut pull whatever the runtime was asked): the
// repository counts as a pull in flight, every preloaded image of it is
// hidden and refused, and the next GC run turns the preloaded image into
// one pulled with no verified credential, with no preloaded names, for
// good. Any tenant takes any preloaded image away from every other.
func TestAPullCutBeforeTheRuntimeWasAskedLeavesTheNodeAsItWas(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.node.preload(base, refBase)
	if err := s.guard.ObserveLayers(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gate := make(chan struct{}) // the registry is slow to answer
	s.node.mu.Lock()
	s.node.checkGate = gate
	// B's pod goes away once the pull has looked at the node.
	s.node.afterStatus = func(*runtimeapi.ImageStatusResponse) { cancel() }
	s.node.mu.Unlock()
	var asked atomic.Int32
	_, err := s.guard.PullImage(ctx, pullOf(base, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		asked.Add(1)
		return s.node.PullImage(ctx, r)
	})
	s.node.mu.Lock()
	s.node.checkGate, s.node.afterStatus = nil, nil
	s.node.mu.Unlock()
	if err == nil {
		t.Fatal("the cut pull succeeded")
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the runtime was asked %d times, want none (the image is on the node)", n)
	}
	if intents, err := s.store.Intents(); err != nil || len(intents) != 0 {
		t.Errorf("intents after a pull cut before the runtime was asked: %v, %v; want none", intents, err)
	}
	if got := s.start(podC, base, "Never"); got != running {
		t.Errorf("C, the preloaded image, right after: %s, want %s", got, running)
	}
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.start(pod{uid: "c2"}, base, "Never"); got != running {
		t.Errorf("C, the preloaded image, after a GC run: %s, want %s", got, running)
	}
	if err := s.create(pod{uid: "c3"}, refBase, ""); err != nil {
		t.Errorf("C, the preloaded image by ID, after a GC run: %v, want it created", err)
	}
}

// TestTheLayersOfAnImageACutPullLeftArePrivateBeforeAnyGCRun: B pulls A's
// private image with a wrong credential; the registry refuses it while the
// runtime pulls it through a mirror that serves anyone; the proxy stops
// the runtime's pull, and containerd creates the image anyway a moment
// later. Until a GC run settles the kept intent, that image has no record
// and no known layers, and is marked nowhere: its layers count as public.
// B's own registry then serves a config naming them, and the runtime
// builds B's image from A's layers with no byte of them proven: B runs
// A's content, and its record vouches for the layers as B's repository
// from then on. The layers must count as private as soon as the image is
// on the node (as for a refused pull, whose leftover is tracked at once).
func TestTheLayersOfAnImageACutPullLeftArePrivateBeforeAnyGCRun(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.mirror = true
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{} // B's registry holds no byte of A's layers
	stoppedPull(t, s, secret, podBWrong)
	n.put(secret, refSecret) // containerd finishes B's pull after its client's cancel
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of A's image the cut pull left: %s, want %s (its layers proven by their bytes)", got, errImagePull)
	}
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.start(pod{uid: "b6", creds: podBOwn.creds}, forged, "IfNotPresent"); got == running {
		t.Errorf("after a GC run settled the cut pull, B's image holding A's layers still runs for B: %s", got)
	}
}

// TestAVerifiedPullWhoseRecordCannotBeWrittenKeepsItsLayersPrivate: A's
// pull is verified, but its record cannot be written (a full disk: B can
// fill the node's filesystem from an emptyDir). The image is tracked as
// unrecorded, yet its layers are neither kept nor marked unknown (keepLayers
// is skipped for a verified pull whose registry listed the layers), so
// until a GC run they count as public: B's config naming them needs no
// proof, and B runs A's layers (and B's record vouches for them for good).
func TestAVerifiedPullWhoseRecordCannotBeWrittenKeepsItsLayersPrivate(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{}
	mem := s.store.(*ensuretest.MemoryStore)
	mem.FailWrites = errors.New("no space left on device")
	if got := s.start(podA, secret, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	mem.FailWrites = nil // the disk has room again
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of A's unrecorded image: %s, want %s", got, errImagePull)
	}
}

// noteFailingStore is a store whose NoteLayers fails while fail is set (a
// write that fails on its own: the records' transaction went through).
type noteFailingStore struct {
	*ensuretest.MemoryStore
	fail atomic.Bool
}

func (s *noteFailingStore) NoteLayers(ref string, diffIDs []digest.Digest, seen time.Time) error {
	if s.fail.Load() {
		return errors.New("no space left on device")
	}
	return s.MemoryStore.NoteLayers(ref, diffIDs, seen)
}

// TestLayersThatCouldNotBeKeptAreMarkedUnknown: B's refused pull of A's
// image through a mirror leaves it on the node, tracked; keeping its
// layers fails. learnLayers then drops the image from the unknown ones and
// says its layers are known, so they are neither kept nor marked unknown:
// public until a GC run, and B's config naming them runs with no proof.
func TestLayersThatCouldNotBeKeptAreMarkedUnknown(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	store := &noteFailingStore{MemoryStore: ensuretest.NewMemoryStore()}
	s.store, s.checked = store, true
	s.restart(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.mirror = true
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{}
	gate := make(chan struct{})
	n.mu.Lock()
	n.checkGate = gate
	n.mu.Unlock()
	store.fail.Store(true)
	_, err := s.guard.PullImage(context.Background(), pullOf(secret, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		resp, err := n.PullImage(ctx, r)
		close(gate) // the registry refuses once the runtime pulled
		return resp, err
	})
	store.fail.Store(false)
	if err == nil || !n.has(refSecret) {
		t.Fatalf("B's pull of A's image: %v, left it: %v; want refused, left", err, n.has(refSecret))
	}
	trackedUnverified(t, s.store, refSecret)
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of the tracked leftover: %s, want %s", got, errImagePull)
	}
}

// TestAPullRacingTheRemovalOfItsImageTakesNoNameForPreloaded: A's pod
// pulls A's private image again (Always); right after the pull looked at
// the node (the image is there: "before"), the kubelet's image GC removes
// it through the proxy (B can bring disk pressure on), and the record is
// forgotten. The registry check finds no image on the node to answer from
// (ErrMoved), so the runtime pulls it back, and settle's namesBeforePull sees
// an image with no record that the name stood for before the pull: it
// takes A's tag for a preloaded name. A's private image is then free to
// every tenant, by that tag and by ID. An image that had a record when the
// pull began was never free.
func TestAPullRacingTheRemovalOfItsImageTakesNoNameForPreloaded(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	ctx := context.Background()
	var once sync.Once
	var removed atomic.Bool
	s.node.mu.Lock()
	s.node.afterStatus = func(*runtimeapi.ImageStatusResponse) {
		once.Do(func() {
			s.node.mu.Lock()
			s.node.afterStatus = nil
			s.node.mu.Unlock()
			// The kubelet's image GC, through the proxy.
			_, err := s.guard.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.node.RemoveImage)
			removed.Store(err == nil && !s.node.has(refApp))
		})
	}
	s.node.mu.Unlock()
	var pulls atomic.Int32
	resp, err := s.guard.PullImage(ctx, pullOf(private, podA2), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		pulls.Add(1)
		return s.node.PullImage(ctx, r)
	})
	if err != nil || resp.GetImageRef() != refApp || !removed.Load() || pulls.Load() != 1 {
		t.Fatalf("A's second pull: %v, %v; removed meanwhile: %v; runtime pulls: %d", resp, err, removed.Load(), pulls.Load())
	}
	if got := s.store.Preloaded(refApp); len(got) != 0 {
		t.Errorf("A's private image has preloaded names %q, want none", got)
	}
	if got := s.start(podC, private, "Never"); got != errNeverPull {
		t.Errorf("C, A's image by its tag: %s, want %s", got, errNeverPull)
	}
	if err := s.create(podC, refApp, ""); status.Code(err) != codes.PermissionDenied {
		t.Errorf("C, A's image by ID: %v, want PermissionDenied", err)
	}
}

// TestAnImageACutPullLeftIsTrackedAfterItsTagMovedOn: B pulls A's image
// team-a/app:v1 with a wrong credential through a mirror that serves
// anyone; the proxy stops the runtime's pull, and containerd creates the
// image (v1 as it was then) after the cancel: its intent is kept. A's CI
// then moves the tag, and A's next pull of team-a/app:v1 is verified for
// the new image. That pull "settles" B's kept intent (settlePulled), and
// a GC run would look the intent's name up and find the new image anyway:
// the image B's cut pull created, left with only its repo digest, is never
// tracked, and counts as preloaded. Every tenant runs A's previous
// version by its repo digest or its ID.
func TestAnImageACutPullLeftIsTrackedAfterItsTagMovedOn(t *testing.T) {
	t.Parallel()
	const refAppNext = "sha256:1212121212121212121212121212121212121212121212121212121212121212"
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.mirror = true
	stoppedPull(t, s, private, podBWrong)
	n.create(private, refApp)                  // containerd finishes B's pull after its client's cancel
	n.serve(private, refAppNext, "alice:a-pw") // A's CI pushes a new v1
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A's pull of the moved tag: %s", got)
	}
	n.untag(private, refApp) // containerd moved the tag off the image B's pull left
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !n.has(refApp) {
		t.Fatal("the image B's cut pull left is gone")
	}
	byDigest := "registry.test/team-a/app@" + manifestDigest(refApp)
	if got := s.start(podC, byDigest, "Never"); got != errNeverPull {
		t.Errorf("C, the image B's cut pull left, by its repo digest: %s, want %s", got, errNeverPull)
	}
	if err := s.create(podC, refApp, ""); status.Code(err) != codes.PermissionDenied {
		t.Errorf("C, the image B's cut pull left, by ID: %v, want PermissionDenied", err)
	}
}

// listHook is the fake node whose ListImages runs after, once, after it
// listed: what happens on the node between a GC run's list and the rest
// of the run.
type listHook struct {
	*fakeNode
	mu    sync.Mutex
	after func()
}

func (l *listHook) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest, opts ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error) {
	resp, err := l.fakeNode.ListImages(ctx, req, opts...)
	l.mu.Lock()
	after := l.after
	l.after = nil
	l.mu.Unlock()
	if after != nil {
		after()
	}
	return resp, err
}

// TestAGCRunsOldListDropsNoLayerMarkSetSince: on a runtime that does not
// say which layers an image holds (CRI-O), the leftover of B's refused
// pull of A's image is marked as holding unknown layers: every layer
// counts as private. A GC run that listed the node's images just before
// that pull settled drops the mark (retain keeps only the images of its
// list): the leftover's layers are public until the next run, and B's
// config naming them runs with no proof.
func TestAGCRunsOldListDropsNoLayerMarkSetSince(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	hook := &listHook{fakeNode: n}
	p, err := decision.NewPolicy(decision.NeverVerifyPreloadedImages, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.guard, err = ensure.NewGuard(s.store, p, ensure.CRIRuntime(hook, n), ensure.GuardOptions{
		Clock: s.clock, Registry: n, Logger: slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.guard.ObserveLayers(context.Background()); err != nil {
		t.Fatal(err)
	}
	n.mirror, n.noConfig = true, true
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{}

	var pullErr error
	hook.mu.Lock()
	hook.after = func() {
		// B's refused pull settles between the GC run's list and its look.
		gate := make(chan struct{})
		n.mu.Lock()
		n.checkGate = gate
		n.mu.Unlock()
		_, pullErr = s.guard.PullImage(context.Background(), pullOf(secret, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
			resp, err := n.PullImage(ctx, r)
			close(gate)
			return resp, err
		})
		n.mu.Lock()
		n.checkGate = nil
		n.mu.Unlock()
	}
	hook.mu.Unlock()
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if pullErr == nil || !n.has(refSecret) {
		t.Fatalf("B's pull of A's image: %v, left it: %v; want refused, left", pullErr, n.has(refSecret))
	}
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of the leftover whose layers the runtime does not say: %s, want %s", got, errImagePull)
	}
}

// TestAnImageTrackedAsArrivedKeepsItsLayersPrivate: on a runtime that does
// not say which layers an image holds (CRI-O), an image that came around
// the proxy is tracked (every pod verifies it) when a container would see
// it; its layers must then count as private, as a tracked leftover's do
// (marked unknown). track records it and marks nothing: a config of B's
// naming its layers runs with no proof until a GC run.
func TestAnImageTrackedAsArrivedKeepsItsLayersPrivate(t *testing.T) {
	t.Parallel()
	lAround := digest.FromString("a layer of the image that came around the proxy")
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	n := s.node
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refAround, lAround)
	n.withLayers(refForged, lAround)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{}
	if got := s.start(podA, secret, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	n.mu.Lock()
	n.noConfig = true
	n.mu.Unlock()
	s.clock.Step(time.Minute)
	n.put(around, refAround) // came around the proxy
	if err := s.create(podC, refAround, around); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("C, the image that came around the proxy: %v, want PermissionDenied", err)
	}
	trackedUnverified(t, s.store, refAround)
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of the tracked image: %s, want %s", got, errImagePull)
	}
}

// TestTheLayersOfALeftOverPullsImageArePrivateBeforeItIsSettled: the
// daemon restarts after a crash mid-pull of A's private image (the runtime
// finished it; the record was not written), and the runtime does not
// answer yet (node boot): Recover fails, and both it and the first look at
// the node are retried every 5 s. When the look succeeds first, the
// leftover's image is taken for one the node held before the proxy (no
// record: a preloaded candidate) and its layers for public: B's config
// naming them runs with no proof until Recover settles the intent, and
// B's record vouches for them for good.
func TestTheLayersOfALeftOverPullsImageArePrivateBeforeItIsSettled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked, s.unobserved = true, true
	n := s.node
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refForged, lBase, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.serve(forged, refForged, "", "bob:b-pw")
	n.holds = map[string]map[digest.Digest]bool{}
	// The crash: the runtime finished A's pull, the record was not written.
	if _, err := s.store.AddIntent(secret); err != nil {
		t.Fatal(err)
	}
	n.put(secret, refSecret)
	n.setListErr(status.Error(codes.Unavailable, "connection refused"))
	s.restart(t, decision.NeverVerifyPreloadedImages)
	if _, _, err := s.guard.Recover(ctx); err == nil {
		t.Fatal("Recover with the runtime down succeeded")
	}
	n.setListErr(nil)
	// The daemon's look at the node is retried first.
	if err := s.guard.ObserveLayers(ctx); err != nil {
		t.Fatalf("the look at the node: %v", err)
	}
	if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
		t.Errorf("B's config naming the layers of the leftover's image, before Recover: %s, want %s", got, errImagePull)
	}
}
