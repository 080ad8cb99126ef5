package ensure_test

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
)

func TestRevokeDropsTheGrantsOfRunningPods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		revoke func(*ensure.LocalAdmin) (ensure.RevokeResult, error)
	}{
		{"revoking the service account makes its running pod re-check at its next container start",
			func(a *ensure.LocalAdmin) (ensure.RevokeResult, error) {
				return a.RevokeServiceAccount(ctx, "a", "builder")
			}},
		{"revoking the image makes its running pod re-check at its next container start",
			func(a *ensure.LocalAdmin) (ensure.RevokeResult, error) { return a.RevokeImage(ctx, refApp) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, ensure.NeverVerifyPreloadedImages)
			store, err := ensure.Open(filepath.Join(t.TempDir(), "ensure.db"), ensure.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close() })
			s.store = store
			s.restart(t, ensure.NeverVerifyPreloadedImages)

			// A token plugin behind the guard pulls for pod a1 with its
			// service account a/builder, and says so.
			spec := &runtimeapi.ImageSpec{Image: private}
			_, err = s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec, SandboxConfig: podA.sandbox()},
				func(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
					criproxy.ReportPullCredential(ctx, criproxy.PullCredential{Provider: "tp",
						ServiceAccount: &criproxy.ServiceAccountRef{Namespace: "a", Name: "builder", UID: "sa-1"}})
					req.Auth = cred("alice:a-pw")
					return s.node.PullImage(ctx, req)
				})
			if err != nil {
				t.Fatal(err)
			}
			create := func() error {
				_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
					Config:        &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refApp, UserSpecifiedImage: private}},
					SandboxConfig: podA.sandbox(),
				}, s.node.CreateContainer)
				return err
			}
			if err := create(); err != nil {
				t.Fatalf("before the revoke, the pod that pulled is refused: %v", err)
			}
			admin := &ensure.LocalAdmin{Store: store, Guard: s.guard, GrantsKnown: true}
			if res, err := tc.revoke(admin); err != nil || res.Records != 1 {
				t.Fatalf("revoke: %+v, %v", res, err)
			}
			if err := create(); status.Code(toStatus(err)) != codes.PermissionDenied {
				t.Errorf("after the revoke, the running pod's grant still lets a container in: %v", err)
			}
		})
	}
}
