package ensure_test

import (
	"context"
	"strings"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestARefusalSaysWhatHappened: an anonymous pull the runtime answered
// with another image than the registry resolved (a tag moved) is aborted
// and leaves that image, tracked with no verified credential. A container
// of it is refused, and neither the pod nor the operator is told it was
// pulled with credentials: the pod reads that it runs after a pull the
// registry accepts, the operator's log that it arrived by a pull the
// registry did not verify.
func TestARefusalSaysWhatHappened(t *testing.T) {
	t.Parallel()
	const moved = "registry.test/public/moved:v1"
	const refMoved = "sha256:7777777777777777777777777777777777777777777777777777777777777777"
	s := newCheckedSetup(t, decision.NeverVerifyPreloadedImages)
	s.node.serve(moved, refTool, "")
	ctx := context.Background()
	p := pod{uid: "anon1", ns: "tenant"}
	_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: moved}, SandboxConfig: p.sandbox()},
		func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
			s.node.put(moved, refMoved) // the tag moved between the check and the pull
			return &runtimeapi.PullImageResponse{ImageRef: refMoved}, nil
		})
	if status.Code(toStatus(err)) != codes.Aborted {
		t.Fatalf("the pull: %v, want Aborted", err)
	}
	if !s.node.has(refMoved) {
		t.Fatal("the aborted pull left no image")
	}
	_, err = s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refMoved, UserSpecifiedImage: moved}},
		SandboxConfig: p.sandbox(),
	}, s.node.CreateContainer)
	st := status.Convert(toStatus(err))
	if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), moved) || !strings.Contains(st.Message(), "it runs only after a pull for this pod that the registry accepts") {
		t.Errorf("the create: %v; want PermissionDenied naming the image as the pod did and what lets it run", err)
	}
	for _, untrue := range []string{"credential", refMoved, refMoved[7:19]} {
		if strings.Contains(st.Message(), untrue) {
			t.Errorf("the pod reads %q: %s", untrue, st.Message())
		}
	}
	log := s.log.String()
	if !strings.Contains(log, "arrived by a pull the registry did not verify") || strings.Contains(log, "was pulled with credentials") {
		t.Errorf("the operator's log does not say what happened:\n%s", log)
	}
}
