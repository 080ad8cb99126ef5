package ensure_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/ensuretest"
)

// TestEveryPullThatEndsLeavesItsImageTracked: whatever way a pull of a
// private image ends (the runtime's success with the client gone, the
// runtime's error after the content arrived, a cancel before or after the
// runtime's answer, the record write failing, the runtime not answering
// afterwards), an image the runtime holds afterwards is either recorded
// with the credential verified for it or tracked as pulled with no
// verified credential: never taken for a preloaded image. Tenant B, with
// no credential, is hidden it and refused it by name and by ID; tenant A
// pulls again and re-uses as before.
func TestEveryPullThatEndsLeavesItsImageTracked(t *testing.T) {
	t.Parallel()
	canceled := status.Error(codes.Canceled, "context canceled")
	for _, tc := range []struct {
		name string
		// end is the runtime's side of A's pull: it may put the image on
		// the node, cancel the client, and answer.
		end func(n *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error)
		// storeFails makes the record write fail.
		storeFails bool
		// runtimeDownAfter makes the runtime stop answering once the pull
		// ended, until a GC run.
		runtimeDownAfter bool
		// late puts the image on the node once the guard has answered: the
		// runtime went on with the pull after its client went away, and
		// finished it after the guard asked what the pull left (containerd
		// does: e2e TestCutPullsLeaveNothingOpen).
		late    bool
		arrived bool // the image is on the node afterwards
	}{
		{
			name: "the runtime pulled the image, and the client was gone before its answer",
			end: func(n *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				n.put(private, refApp)
				cancel()
				return nil, canceled
			},
			arrived: true,
		},
		{
			name: "the runtime failed after the content arrived",
			end: func(n *fakeNode, _ context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				n.put(private, refApp)
				return nil, status.Error(codes.Unknown, "failed to unpack image: short write")
			},
			arrived: true,
		},
		{
			name: "the client cancelled before anything arrived",
			end: func(_ *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				cancel()
				return nil, canceled
			},
		},
		{
			name: "the client cancelled right after the runtime's answer",
			end: func(n *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				n.put(private, refApp)
				cancel()
				return &runtimeapi.PullImageResponse{ImageRef: refApp}, nil
			},
			arrived: true,
		},
		{
			name: "the pull succeeded and its record could not be written",
			end: func(n *fakeNode, _ context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				n.put(private, refApp)
				return &runtimeapi.PullImageResponse{ImageRef: refApp}, nil
			},
			storeFails: true,
			arrived:    true,
		},
		{
			name: "the client went away and the runtime finished the pull after the guard asked",
			end: func(_ *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				cancel()
				return nil, canceled
			},
			late:    true,
			arrived: true,
		},
		{
			name: "the pull was cut and the runtime did not answer afterwards",
			end: func(n *fakeNode, cancel context.CancelFunc) (*runtimeapi.PullImageResponse, error) {
				n.put(private, refApp)
				cancel()
				return nil, canceled
			},
			runtimeDownAfter: true,
			arrived:          true,
		},
	} {
		for _, checked := range []bool{false, true} {
			name := tc.name
			if checked {
				// As the daemon chains it: the registry check innermost.
				name += ", with the registry check"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := newSetup(t, decision.NeverVerifyPreloadedImages)
				if checked {
					s.checked = true
					s.restart(t, decision.NeverVerifyPreloadedImages)
				}
				mem := s.store.(*ensuretest.MemoryStore)
				if tc.storeFails {
					mem.FailWrites = errors.New("no space left on device")
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				runtimePull := func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					resp, err := tc.end(s.node, cancel)
					if tc.runtimeDownAfter {
						s.node.setStatusErr(status.Error(codes.Unavailable, "connection refused"))
					}
					return resp, err
				}
				_, _ = s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()}, runtimePull)
				if tc.late {
					s.node.put(private, refApp)
				}
				if got := s.node.has(refApp); got != tc.arrived {
					t.Fatalf("the node holds the image: %v, want %v", got, tc.arrived)
				}
				if tc.runtimeDownAfter {
					// Until the runtime answers, the repository counts as pulled:
					// B's CreateContainer by name is refused (Unavailable).
					if got := s.start(podB, private, "Never"); got == running {
						t.Errorf("while the runtime does not answer, tenant B: %s", got)
					}
					s.node.setStatusErr(nil)
					if _, _, err := s.guard.GC(context.Background()); err != nil {
						t.Fatalf("GC: %v", err)
					}
				}
				assertTracked(t, s, tc.arrived)
				if tc.storeFails {
					mem.FailWrites = nil
				}
				// The puller pulls again and then re-uses, as before.
				if got := s.start(podA, private, "IfNotPresent"); got != running {
					t.Errorf("tenant A pulls again: %s", got)
				}
				before := s.node.registryRequests()
				if got := s.start(podA2, private, "IfNotPresent"); got != running || s.node.registryRequests() != before {
					t.Errorf("tenant A's second pod: %s, %d registry requests; want a re-use", got, s.node.registryRequests()-before)
				}
				assertTracked(t, s, true)
				if ints, err := s.store.Intents(); err != nil || len(ints) != 0 {
					t.Errorf("intents left: %v, %v", ints, err)
				}
			})
		}
	}
}

// assertTracked checks, when the image is on the node, that tenant B (no
// credential) is hidden it and refused it by name, by ID and by ID prefix.
func assertTracked(t *testing.T, s *setup, arrived bool) {
	t.Helper()
	if !arrived {
		return
	}
	ctx := context.Background()
	if got := s.start(podB, private, "Never"); got != errNeverPull {
		t.Errorf("tenant B, Never, by name: %s, want %s", got, errNeverPull)
	}
	for _, name := range []string{refApp, refApp[len("sha256:"):][:16]} {
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
			Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: name}},
			SandboxConfig: podB.sandbox(),
		}, s.node.CreateContainer)
		if status.Code(toStatus(err)) != codes.PermissionDenied {
			t.Errorf("tenant B's CreateContainer of %s: %v, want PermissionDenied", name, err)
		}
	}
}

// TestCutPullsRaceNothingOpen runs cut pulls of one private image from
// many clients at once, under -race: afterwards the image is tracked.
func TestCutPullsRaceNothingOpen(t *testing.T) {
	t.Parallel()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _ = s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()},
				func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					if i%2 == 0 {
						s.node.put(private, refApp)
					}
					cancel()
					return nil, status.Error(codes.Canceled, "context canceled")
				})
		}()
	}
	wg.Wait()
	assertTracked(t, s, true)
}
