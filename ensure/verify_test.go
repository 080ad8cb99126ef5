package ensure_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/registry"
)

// newCheckedSetup is a guard that holds pulls to the registry's own word,
// the verifier innermost as the daemon chains it.
func newCheckedSetup(t *testing.T, policy decision.PolicyName) *setup {
	t.Helper()
	s := newSetup(t, policy)
	s.checked = true
	s.restart(t, policy)
	return s
}

// TestTheRegistrysWordNotTheRuntimes: a credential is recorded for an
// image only when the image's own registry resolves the name to that image
// for it; a runtime pull that succeeded through a mirror, or from content
// already on the node, proves nothing.
func TestTheRegistrysWordNotTheRuntimes(t *testing.T) {
	t.Parallel()
	t.Run("a mirror that serves anyone: B without a credential and B with a wrong one are refused, C never runs A's image, A re-uses", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.mirror = true
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		for _, b := range []pod{podB, podBWrong} {
			before := s.node.registryRequests()
			if got := s.start(b, private, "IfNotPresent"); got != errImagePull {
				t.Errorf("B (%s): %s, want %s", b.uid, got, errImagePull)
			}
			if n := s.node.registryRequests() - before; n != 0 {
				t.Errorf("B (%s): the runtime pulled %d times; a refused credential must not reach it", b.uid, n)
			}
		}
		if got := s.start(pod{uid: "c1"}, private, "Never"); got != errNeverPull {
			t.Errorf("C, Never: %s, want %s", got, errNeverPull)
		}
		before := s.node.registryRequests()
		if got := s.start(podA2, private, "IfNotPresent"); got != running || s.node.registryRequests() != before {
			t.Errorf("A's second pod: %s, %d runtime pulls; want a re-use", got, s.node.registryRequests()-before)
		}
	})
	t.Run("a new credential for an image on the node is verified at the registry and answered from the node: no runtime pull", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		pulls, checks := s.node.registryRequests(), s.node.registryChecks()
		if got := s.start(podBOwn, private, "IfNotPresent"); got != running {
			t.Fatalf("B with its own credential: %s", got)
		}
		if s.node.registryRequests() != pulls || s.node.registryChecks() != checks+1 {
			t.Errorf("%d runtime pulls, %d registry checks; want 0 and 1", s.node.registryRequests()-pulls, s.node.registryChecks()-checks)
		}
		if got := s.start(pod{uid: "b9", creds: podBOwn.creds}, private, "IfNotPresent"); got != running || s.node.registryChecks() != checks+1 {
			t.Errorf("B's second pod: %s, %d more checks; want a re-use from the record", got, s.node.registryChecks()-checks-1)
		}
		e, err := s.guard.Explain(context.Background(), private, "")
		if err != nil || len(e.Verifications) != 1 || e.Verifications[0].Endpoint != "https://registry.test/v2" || !e.Verifications[0].FromNode {
			t.Fatalf("explain does not say which endpoint verified the last credential: %+v, %v", e, err)
		}
		if b := e.Verifications[0].CheckedBlobs; len(b) != 2 || b[0] != refApp {
			t.Errorf("explain lists the blobs checked as %v; want the config %s and a layer", b, refApp)
		}
	})
	t.Run("a tag moved since the image came: the runtime pulls the new image, recorded for the credential", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		const refNew = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
		s.node.mu.Lock()
		s.node.remote[norm(private)] = refNew
		delete(s.node.local, norm(private))
		s.node.mu.Unlock()
		s.node.preload(private, refApp) // the node still names the old image
		before := s.node.registryRequests()
		if got := s.start(podBOwn, private, "IfNotPresent"); got != running {
			t.Fatalf("B: %s", got)
		}
		if n := s.node.registryRequests() - before; n != 1 {
			t.Errorf("%d runtime pulls, want 1 (the moved tag pulls)", n)
		}
	})
	t.Run("a registry that cannot be asked refuses the pull, Unavailable, naming no other tenant's image", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		s.node.registryErr = &registry.Error{Kind: registry.ErrUnreachable, Endpoint: "https://registry.test/v2", Reason: "the registry did not answer", Detail: "dial tcp: connection refused"}
		_, err := s.guard.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()}, s.runtimePull)
		if st := status.Convert(toStatus(err)); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "did not answer") || strings.Contains(st.Message(), "connection refused") {
			t.Errorf("got %v; want Unavailable with the short reason, the detail for the operator only", err)
		}
		if !strings.Contains(s.log.String(), "connection refused") {
			t.Errorf("the operator's log does not have the cause")
		}
		// The runtime pulled beside the check; what it left is tracked with
		// no verified credential: every pod verifies it.
		if s.node.has(refApp) {
			trackedUnverified(t, s.store, refApp)
		}
	})
	t.Run("the runtime pulled another image than the registry answered: nothing recorded for the credential, the image tracked", func(t *testing.T) {
		t.Parallel()
		s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
		_, err := s.guard.PullImage(context.Background(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()},
			func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
				s.node.put(private, refTool) // the tag moved between the check and the pull
				return &runtimeapi.PullImageResponse{ImageRef: refTool}, nil
			})
		if status.Code(toStatus(err)) != codes.Aborted {
			t.Errorf("got %v, want Aborted (retry)", err)
		}
		assertTracked(t, s, false)
		if got := s.start(podB, private, "Never"); got != errNeverPull {
			t.Errorf("B, Never: %s, want %s", got, errNeverPull)
		}
	})
}

// trackedUnverified fails the test unless ref has a record and none of its
// repositories holds a verified credential: a pull left it, and every pod
// must verify it.
func trackedUnverified(t *testing.T, store ensure.RecordStore, ref string) {
	t.Helper()
	rec, err := store.Get(ref)
	if err != nil {
		t.Fatalf("the image the pull left is not tracked: %v", err)
	}
	for repo, c := range rec.CredentialMapping {
		if c.NodePodsAccessible || len(c.KubernetesSecrets) > 0 || len(c.KubernetesServiceAccounts) > 0 {
			t.Errorf("%s: %+v, want no verified credential", repo, c)
		}
	}
}
