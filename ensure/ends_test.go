package ensure_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/imagepolicytest"
)

// endCase is one way a pull through the proxy ends, and what the node and
// the records hold afterwards.
type endCase struct {
	name string
	// run makes the pull end that way on s (a checked guard whose runtime
	// pulls through a mirror that serves anyone); it returns the image
	// and ID the end is about, and may leave work for late: what the
	// runtime does after the guard answered.
	run func(t *testing.T, s *setup) (image, id string, late func())
	// policy gives the setup an image policy (namespace secure).
	policy bool
	// arrived: the node holds the image afterwards.
	arrived bool
	// intentKept: right after the end, the pull's intent stays (the
	// runtime's last word is not known); a GC run settles it.
	intentKept bool
	// preloaded are the names the image keeps as preloaded.
	preloaded []string
	// ownerRuns: the tenant whose credential the registry verified runs
	// it with no new pull.
	ownerRuns bool
	// freeByID: the image was free to every pod before (a preloaded name),
	// so its ID, which names those very bytes, stays free.
	freeByID bool
}

// TestEveryEndKeepsTheSameFacts: however a pull ends (verified, refused by
// the registry or by the image policy, failed, stopped by the proxy, cut
// by its caller, left over by a crash, arrived around the proxy, answered
// from the node), the same facts are kept: the record, or the intent until
// the runtime's word is known; the image's layers, learnt from the
// runtime; the names that were free before. Any image of it on the node is
// hidden from, and refused to, every tenant the registry did not verify it
// for, by name, by ID and by ID prefix.
func TestEveryEndKeepsTheSameFacts(t *testing.T) {
	t.Parallel()
	canceled := status.Error(codes.Canceled, "context canceled")
	for _, tc := range []endCase{
		{
			name: "verified: the registry accepted A's secret",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				if got := s.start(podA, private, "IfNotPresent"); got != running {
					t.Fatalf("A: %s", got)
				}
				return private, refApp, nil
			},
			arrived: true, ownerRuns: true,
		},
		{
			name: "verified, the image on the node before under another name: that name stays free",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				s.node.preload("registry.test/base/app:node", refApp)
				s.restart(t, decision.NeverVerifyPreloadedImages)
				if got := s.start(podA, private, "IfNotPresent"); got != running {
					t.Fatalf("A: %s", got)
				}
				return private, refApp, nil
			},
			arrived: true, ownerRuns: true, freeByID: true, preloaded: []string{"registry.test/base/app:node"},
		},
		{
			name: "answered from the node: A's second pod, after a hide",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				if got := s.start(podA, private, "IfNotPresent"); got != running {
					t.Fatalf("A: %s", got)
				}
				before := s.node.registryRequests()
				if got := s.start(podA2, private, "IfNotPresent"); got != running || s.node.registryRequests() != before {
					t.Fatalf("A's second pod: %s, %d registry requests", got, s.node.registryRequests()-before)
				}
				return private, refApp, nil
			},
			arrived: true, ownerRuns: true,
		},
		{
			name: "refused by the registry after the runtime pulled through the mirror",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				gate := make(chan struct{})
				s.node.checkGate = gate
				_, err := s.guard.PullImage(context.Background(), pullOf(private, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					resp, err := s.node.PullImage(ctx, r)
					close(gate) // the registry answers once the runtime pulled
					return resp, err
				})
				wantRefused(t, err)
				return private, refApp, nil
			},
			arrived: true,
		},
		{
			name: "stopped by the proxy: the registry refused while the runtime pulled, and the runtime created the image after its client's cancel",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				gate := make(chan struct{})
				s.node.checkGate = gate
				_, err := s.guard.PullImage(context.Background(), pullOf(private, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					close(gate)  // the refusal comes while the runtime pulls
					<-ctx.Done() // the proxy stops the runtime's pull
					return nil, canceled
				})
				wantRefused(t, err)
				return private, refApp, func() { s.node.put(private, refApp) } // containerd finishes it anyway
			},
			arrived: true, intentKept: true,
		},
		{
			name: "stopped by the proxy, and the runtime left nothing",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				gate := make(chan struct{})
				s.node.checkGate = gate
				_, err := s.guard.PullImage(context.Background(), pullOf(private, podBWrong), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					close(gate)
					<-ctx.Done()
					return nil, canceled
				})
				wantRefused(t, err)
				return private, refApp, nil
			},
			intentKept: true,
		},
		{
			name:   "refused by the image policy: the runtime is never asked",
			policy: true,
			run: func(t *testing.T, s *setup) (string, string, func()) {
				var asked atomic.Int32
				_, err := s.guard.PullImage(context.Background(), pullOf(unsignedImage, podSecure), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					asked.Add(1)
					return s.node.PullImage(ctx, r)
				})
				if status.Code(toStatus(err)) != codes.PermissionDenied {
					t.Fatalf("the policy's refusal: %v, want PermissionDenied", err)
				}
				if n := asked.Load(); n != 0 {
					t.Fatalf("the runtime was asked %d times, want none", n)
				}
				return unsignedImage, refUnsigned, nil
			},
		},
		{
			name: "failed: the runtime's own error after the content arrived",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				_, err := s.guard.PullImage(context.Background(), pullOf(private, podA), func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					s.node.put(private, refApp)
					return nil, status.Error(codes.Unknown, "failed to unpack image: short write")
				})
				if err == nil {
					t.Fatal("the pull succeeded")
				}
				return private, refApp, nil
			},
			arrived: true,
		},
		{
			name: "cut by its caller, and the runtime finished the pull afterwards",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				_, err := s.guard.PullImage(ctx, pullOf(private, podA), func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					cancel()
					return nil, canceled
				})
				if err == nil {
					t.Fatal("the pull succeeded")
				}
				return private, refApp, func() { s.node.put(private, refApp) }
			},
			arrived: true, intentKept: true,
		},
		{
			name: "left over by a crash: an intent found at the start, its image on the node",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				if _, err := s.store.AddIntent(private); err != nil {
					t.Fatal(err)
				}
				s.node.put(private, refApp)
				s.restart(t, decision.NeverVerifyPreloadedImages)
				if _, _, err := s.guard.Recover(context.Background()); err != nil {
					t.Fatalf("Recover: %v", err)
				}
				return private, refApp, nil
			},
			arrived: true,
		},
		{
			name: "arrived around the proxy, holding the layers of A's private image",
			run: func(t *testing.T, s *setup) (string, string, func()) {
				if got := s.start(podA, private, "IfNotPresent"); got != running {
					t.Fatalf("A: %s", got)
				}
				s.clock.Step(time.Minute)
				s.node.withLayers(refAround, layerOf(refApp))
				s.node.put(around, refAround) // B pulled it straight from the runtime
				return around, refAround, nil
			},
			arrived: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			s.checked = true
			s.node.mirror = true // the runtime pulls through a mirror that serves anyone
			if tc.policy {
				s.node.serve(unsignedImage, refUnsigned, "")
				s.imagePolicy = newSecurePolicy()
			}
			s.restart(t, decision.NeverVerifyPreloadedImages)
			image, id, late := tc.run(t, s)

			intents, err := s.store.Intents()
			if err != nil {
				t.Fatal(err)
			}
			if got := len(intents) > 0; got != tc.intentKept {
				t.Errorf("an intent right after the end: %v (%v), want %v", got, intents, tc.intentKept)
			}
			if late != nil {
				late()
			}
			// The next GC run finds what the runtime left: an image is
			// recorded and its intent settled; with none, the intent stays
			// (as the kubelet's), until a pull of the name succeeds.
			if _, _, err := s.guard.GC(context.Background()); err != nil {
				t.Fatalf("GC: %v", err)
			}
			intents, err = s.store.Intents()
			if want := tc.intentKept && !tc.arrived; err != nil || (len(intents) > 0) != want {
				t.Errorf("intents after a GC run: %v, %v; want some: %v", intents, err, want)
			}
			if got := s.node.has(id); got != tc.arrived {
				t.Fatalf("the node holds %s: %v, want %v", id, got, tc.arrived)
			}
			if !tc.arrived {
				if len(intents) > 0 {
					if got := s.start(podA, private, "IfNotPresent"); got != running {
						t.Fatalf("A: %s", got)
					}
					if intents, err := s.store.Intents(); err != nil || len(intents) != 0 {
						t.Errorf("intents after A's pull of the name: %v, %v; want none", intents, err)
					}
				}
				return
			}
			rec, err := s.store.Get(id)
			if err != nil {
				t.Fatalf("the image on the node has no record: %v", err)
			}
			if l, ok := s.store.Layers(id); !ok || len(l.DiffIDs) == 0 {
				t.Errorf("the image's layers are not kept: %+v, %v", l, ok)
			}
			if got := s.store.Preloaded(id); strings.Join(got, ",") != strings.Join(tc.preloaded, ",") {
				t.Errorf("preloaded names %q, want %q", got, tc.preloaded)
			}
			if !tc.ownerRuns {
				for repo, c := range rec.CredentialMapping {
					if c.NodePodsAccessible || len(c.KubernetesSecrets) > 0 || len(c.KubernetesServiceAccounts) > 0 {
						t.Errorf("a credential is recorded for %s: %+v", repo, c)
					}
				}
			}
			// No tenant the registry did not verify it for sees it or runs it.
			for _, p := range []pod{podB, podC} {
				assertRefused(t, s, p, image, id, tc.freeByID)
			}
			if tc.ownerRuns {
				before := s.node.registryRequests()
				if got := s.start(podA2, image, "IfNotPresent"); got != running || s.node.registryRequests() != before {
					t.Errorf("A's pod: %s, %d registry requests; want a re-use", got, s.node.registryRequests()-before)
				}
			}
		})
	}
}

// pullOf is a kubelet's PullImage of image for p, with p's first secret.
func pullOf(image string, p pod) *runtimeapi.PullImageRequest {
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, SandboxConfig: p.sandbox()}
	if len(p.creds) > 0 {
		req.Auth = p.creds[0]
	}
	return req
}

// wantRefused fails unless err is the registry's refusal.
func wantRefused(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("the pull succeeded, want the registry's refusal")
	}
}

// layerOf is the fake node's default layer of image id.
func layerOf(id string) digest.Digest { return digest.FromString("diff of " + id) }

// newSecurePolicy is an image policy for namespace secure that allows only
// the signed image.
func newSecurePolicy() *imagepolicytest.Policy {
	f := imagepolicytest.NewPolicy("secure")
	f.Sign(manifestDigest(refSigned))
	return f
}

// assertRefused checks that pod p, with no credential the registry
// verified for image (id), is hidden it and refused it by name, by ID and
// by ID prefix (unless freeByID: the ID named bytes free to every pod).
func assertRefused(t *testing.T, s *setup, p pod, image, id string, freeByID bool) {
	t.Helper()
	if got := s.start(p, image, "Never"); got != errNeverPull {
		t.Errorf("pod %s, Never, by name: %s, want %s", p.uid, got, errNeverPull)
	}
	if freeByID {
		return
	}
	for _, name := range []string{id, id[len("sha256:"):][:16]} {
		err := s.create(p, name, "")
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("pod %s's CreateContainer of %s: %v, want PermissionDenied", p.uid, name, err)
		}
	}
	if err := s.create(p, id, image); status.Code(err) != codes.PermissionDenied {
		t.Errorf("pod %s's CreateContainer of %s as %s: %v, want PermissionDenied", p.uid, id, image, err)
	}
}

// TestALeftoversLayersArePrivate: an image a refused pull left on the node
// (B's pull of A's image through a mirror that serves anyone) is tracked
// with its layers, so a config of B's own naming them must prove them by
// their bytes; where the runtime does not say which layers the leftover
// holds, every layer counts as private until it does. An honest copy,
// whose registry serves the bytes, still runs.
func TestALeftoversLayersArePrivate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		noConfig bool
	}{
		{name: "the runtime says which layers the leftover holds"},
		{name: "the runtime does not say which layers it holds", noConfig: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
			n := s.node
			n.mirror = true
			n.withLayers(refSecret, lBase, lSecret)
			n.withLayers(refForged, lBase, lSecret)
			n.withLayers(refCopy, lBase, lSecret)
			n.serve(secret, refSecret, "alice:a-pw")
			n.serve(forged, refForged, "", "bob:b-pw")
			n.serve(bCopy, refCopy, "bob:b-pw")
			n.holds = map[string]map[digest.Digest]bool{} // B's registry holds no bytes but its copy's
			n.serveBytes("registry.test/team-b/copy", lBase, lSecret)
			n.noConfig = tc.noConfig

			gate := make(chan struct{})
			n.checkGate = gate
			_, err := s.guard.PullImage(context.Background(), pullOf(secret, podBOwn), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				resp, err := n.PullImage(ctx, r)
				close(gate)
				return resp, err
			})
			if err == nil || !n.has(refSecret) {
				t.Fatalf("B's pull of A's image: %v, left it: %v; want refused, left", err, n.has(refSecret))
			}
			n.checkGate = nil
			if got := s.start(podBOwn, forged, "IfNotPresent"); got != errImagePull {
				t.Errorf("B's config naming the leftover's layers: %s, want %s", got, errImagePull)
			}
			if got := s.start(podC, forged, "Never"); got == running {
				t.Errorf("C runs B's forged image: %s", got)
			}
			if got := s.start(podBOwn, bCopy, "IfNotPresent"); got != running {
				t.Errorf("B's honest copy, proven by its bytes: %s, want %s", got, running)
			}
		})
	}
}

// TestTheNodeIsObservedOnlyOnceALookSucceeds: when the daemon's first look
// at the node's images fails (the runtime not answering yet, as at node
// boot), no image counts as preloaded and no layer as public until a look
// succeeds, whichever it is; an image that came around the proxy holding
// a private layer meanwhile is refused, then tracked by that look.
func TestTheNodeIsObservedOnlyOnceALookSucceeds(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked, s.unobserved = true, true
	n := s.node
	n.withLayers(refSecret, lBase, lSecret)
	n.withLayers(refAround, lSecret)
	n.serve(secret, refSecret, "alice:a-pw")
	n.setListErr(status.Error(codes.Unavailable, "connection refused"))
	s.restart(t, decision.NeverVerifyPreloadedImages)
	if err := s.guard.ObserveLayers(context.Background()); err == nil || s.guard.Observed() {
		t.Fatalf("the first look with the runtime down: %v, observed %v", err, s.guard.Observed())
	}
	n.setListErr(nil)
	if got := s.start(podA, secret, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	s.clock.Step(time.Minute)
	n.put(around, refAround) // B pulled it straight from the runtime

	// No look has succeeded yet: refused, and tracked by nothing yet.
	for _, p := range []pod{podB, podC} {
		if err := s.create(p, refAround, around); status.Code(err) != codes.PermissionDenied {
			t.Errorf("before a look, pod %s's container of %s: %v, want PermissionDenied", p.uid, around, err)
		}
	}
	if _, err := s.store.Get(refAround); !errors.Is(err, ensure.ErrNotFound) {
		t.Errorf("before a look, the image is recorded: %v", err)
	}
	// The GC run's look succeeds: the node is observed, and the image
	// that came around the proxy is tracked.
	s.clock.Step(time.Minute)
	if _, _, err := s.guard.GC(context.Background()); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if !s.guard.Observed() {
		t.Fatal("a GC run's look succeeded, and the node is not observed")
	}
	trackedUnverified(t, s.store, refAround)
	for _, p := range []pod{podB, podC} {
		assertRefused(t, s, p, around, refAround, false)
	}
}

// TestAPullRefusedByPolicyLeavesTheNodeAsItWas: with ensure on, the image
// policy decides on the digest the registry names before the runtime is
// asked: a refused tag that moved in the registry leaves the node's tag on
// the image it named before, and nothing new on the node; pods of the
// signed image by that tag go on running it.
func TestAPullRefusedByPolicyLeavesTheNodeAsItWas(t *testing.T) {
	t.Parallel()
	s, _ := newPolicySetup(t)
	if got := s.start(podSecure, signedImage, "IfNotPresent"); got != running {
		t.Fatalf("the signed image: %s", got)
	}
	s.node.serve(signedImage, refUnsigned, "") // the tag moved to an unsigned image
	var asked atomic.Int32
	_, err := s.guard.PullImage(context.Background(), pullOf(signedImage, podSecure2), func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		asked.Add(1)
		return s.node.PullImage(ctx, r)
	})
	if status.Code(toStatus(err)) != codes.PermissionDenied {
		t.Fatalf("the moved tag's pull: %v, want PermissionDenied", err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the runtime was asked %d times, want none", n)
	}
	st, err := s.node.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: signedImage}})
	if err != nil || st.GetImage().GetId() != refSigned {
		t.Errorf("the node's tag names %q (%v), want the signed image %s", st.GetImage().GetId(), err, refSigned)
	}
	if s.node.has(refUnsigned) {
		t.Error("the unsigned image is on the node")
	}
	// Pods of the signed image by that tag still run it (IfNotPresent).
	if got := s.start(podSecure2, signedImage, "IfNotPresent"); got != running {
		t.Errorf("a pod of the signed image by its tag: %s, want %s", got, running)
	}
}

// TestTheLogSaysACredentialWasRecordedOnlyWhenItWas: a pull whose record
// could not be written says so, never that the credential was recorded.
func TestTheLogSaysACredentialWasRecordedOnlyWhenItWas(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.store.(*ensuretest.MemoryStore).FailWrites = errors.New("no space left on device")
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	log := s.log.String()
	if strings.Contains(log, "credential recorded") {
		t.Errorf("the log says the credential was recorded:\n%s", log)
	}
	if !strings.Contains(log, "could not be recorded") {
		t.Errorf("the log does not say the credential could not be recorded:\n%s", log)
	}
}

// TestAHideOfAnImageGoneSinceAnswersNoPull: a name hidden while its image
// was on the node, the image removed since, and ImageStatus answered
// "absent": the next pull of the name goes to the runtime, never answered
// from the node with the ID of an image that is gone.
func TestAHideOfAnImageGoneSinceAnswersNoPull(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	ctx := context.Background()
	spec := &runtimeapi.ImageSpec{Image: private}
	if st, err := s.imageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.GetImage() != nil {
		t.Fatalf("A's second pod's ImageStatus: %v, %v; want hidden", st, err)
	}
	if _, err := s.node.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: spec}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.imageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.GetImage() != nil {
		t.Fatalf("ImageStatus of the removed image: %v, %v", st, err)
	}
	before := s.node.registryRequests()
	if _, err := s.guard.PullImage(ctx, pullOf(private, podA2), s.runtimePull); err != nil {
		t.Fatalf("A's second pod's pull: %v", err)
	}
	if s.node.registryRequests() == before || !s.node.has(refApp) {
		t.Errorf("the pull was answered from the node, and the node holds the image: %v", s.node.has(refApp))
	}
}

// TestARuntimeThatWritesBareIDs: CRI-O writes image IDs as bare hex
// (containerd as "sha256:<hex>"): the guard records A's pull, hides the
// image from B and refuses B's container by either form of the ID and by
// prefix, answers A's second pod from the node in the runtime's own form,
// learns the image's layers from the config CRI-O gives, and keeps one
// record per image.
func TestARuntimeThatWritesBareIDs(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	s.checked = true
	s.node.bareIDs = true
	s.restart(t, decision.NeverVerifyPreloadedImages)
	bare := strings.TrimPrefix(refApp, "sha256:")
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s\n%s", got, s.log.String())
	}
	if _, err := s.store.Get(refApp); err != nil {
		t.Fatalf("A's pull left no record under %s: %v", refApp, err)
	}
	if l, ok := s.store.Layers(refApp); !ok || len(l.DiffIDs) == 0 {
		t.Errorf("the image's layers are not kept: %+v, %v", l, ok)
	}
	if n, _, _ := s.store.Counts(); n != 1 {
		t.Errorf("%d records, want one", n)
	}
	if got := s.start(podB, private, "Never"); got != errNeverPull {
		t.Errorf("B, Never, by name: %s, want %s", got, errNeverPull)
	}
	for _, ref := range []string{bare, refApp, bare[:16]} {
		if err := s.create(podB, ref, ""); status.Code(err) != codes.PermissionDenied {
			t.Errorf("B's container of %s: %v, want PermissionDenied", ref, err)
		}
	}
	ctx := context.Background()
	spec := &runtimeapi.ImageSpec{Image: private}
	if st, err := s.imageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: spec}); err != nil || st.GetImage() != nil {
		t.Fatalf("A's second pod's ImageStatus: %v, %v; want hidden", st, err)
	}
	before := s.node.registryRequests()
	resp, err := s.guard.PullImage(ctx, pullOf(private, podA2), s.runtimePull)
	if err != nil || resp.GetImageRef() != bare || s.node.registryRequests() != before {
		t.Errorf("A's second pod's pull: %v, %v, %d registry requests; want %s from the node", resp, err, s.node.registryRequests()-before, bare)
	}
	if err := s.create(podA2, bare, private); err != nil {
		t.Errorf("A's second pod's container: %v", err)
	}
}

// TestAPullDuringTheFirstLookWaitsForIt: a pull that comes while the
// daemon's first look at the node's images is under way (a restart on a
// node of many images, the kubelet pulling at once) waits for it, and so
// keeps the names the image was free by before, as after the look.
func TestAPullDuringTheFirstLookWaitsForIt(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.unobserved = true
	s.node.preload("registry.test/base/app:node", refApp)
	s.restart(t, decision.NeverVerifyPreloadedImages)
	endLook := s.guard.Looking()
	atRuntime := make(chan struct{})
	var once sync.Once
	s.node.mu.Lock()
	s.node.afterPull = func(string) { once.Do(func() { close(atRuntime) }) }
	s.node.mu.Unlock()
	pulled := make(chan kubeletResult)
	go func() { pulled <- s.start(podA, private, "IfNotPresent") }()
	<-atRuntime // the pull is under way, the look not made yet
	if err := s.guard.ObserveLayers(context.Background()); err != nil {
		t.Fatal(err)
	}
	endLook()
	if got := <-pulled; got != running {
		t.Fatalf("A: %s", got)
	}
	if got := s.store.Preloaded(refApp); strings.Join(got, ",") != "registry.test/base/app:node" {
		t.Errorf("preloaded names %q, want the name it was free by before", got)
	}
}

// writeCounter is a RecordStore that counts the writes of pulls.
type writeCounter struct {
	ensure.RecordStore
	writes atomic.Int32
}

func (w *writeCounter) AddIntent(image string) (string, error) {
	w.writes.Add(1)
	return w.RecordStore.AddIntent(image)
}

func (w *writeCounter) RecordVerifiedPull(ref, repo string, cred ensure.Credential, diffIDs []digest.Digest, intentID string, now time.Time, preloaded []string) error {
	w.writes.Add(1)
	return w.RecordStore.RecordVerifiedPull(ref, repo, cred, diffIDs, intentID, now, preloaded)
}

func (w *writeCounter) RecordPull(ref, repo string, cred ensure.Credential, intentID string, now time.Time, preloaded []string) error {
	w.writes.Add(1)
	return w.RecordStore.RecordPull(ref, repo, cred, intentID, now, preloaded)
}

// TestARecheckOfARecordedCredentialWritesNothing: a pull of a present image
// (the kubelet's Always policy) that the registry's word answers from the
// node writes no intent (the runtime is not asked), and, for a credential
// the record holds and verified a moment ago, no record; a minute later
// the verification time is written again.
func TestARecheckOfARecordedCredentialWritesNothing(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	w := &writeCounter{RecordStore: s.store}
	s.store = w
	s.restart(t, decision.NeverVerifyPreloadedImages)
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	if n := w.writes.Load(); n != 2 {
		t.Errorf("A's first pull wrote %d times, want its intent and its record", n)
	}
	w.writes.Store(0)
	if got := s.start(podA2, private, "Always"); got != running {
		t.Fatalf("A's second pod, Always: %s", got)
	}
	if n := w.writes.Load(); n != 0 {
		t.Errorf("a re-check answered from the node wrote %d times, want none", n)
	}
	s.clock.Step(2 * time.Minute)
	if got := s.start(podA2, private, "Always"); got != running {
		t.Fatalf("A's second pod, Always, later: %s", got)
	}
	if n := w.writes.Load(); n != 1 {
		t.Errorf("a re-check two minutes later wrote %d times, want the record's verification time", n)
	}
}

// TestAnExpiredRecordsNewVerificationIsWritten: with a maximum record age
// shorter than the re-check's refresh, a credential verified again past
// the age is written, so the next pull re-uses it (the re-check's saving
// must not keep an expired record expired).
func TestAnExpiredRecordsNewVerificationIsWritten(t *testing.T) {
	t.Parallel()
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.guard.SetExpiry(&decision.Expiry{Default: 3 * time.Second})
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	s.clock.Step(4 * time.Second)
	w := &writeCounter{RecordStore: s.store}
	s.store = w
	s.restart(t, decision.NeverVerifyPreloadedImages)
	s.guard.SetExpiry(&decision.Expiry{Default: 3 * time.Second})
	if got := s.start(podA2, private, "IfNotPresent"); got != running {
		t.Fatalf("A's second pod, past the age: %s", got)
	}
	if n := w.writes.Load(); n == 0 {
		t.Errorf("a verification past the maximum age wrote nothing: the record stays expired")
	}
	w.writes.Store(0)
	if got := s.start(podA2, private, "IfNotPresent"); got != running {
		t.Fatalf("A's second pod again: %s", got)
	}
	if n := w.writes.Load(); n != 0 {
		t.Errorf("the pull right after the new verification wrote %d times, want a re-use", n)
	}
}
