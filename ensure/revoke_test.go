package ensure_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

func TestRevokeDropsTheGrantsOfRunningPods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		revoke func(*admin.Local) (admin.RevokeResult, error)
	}{
		{"revoking the service account makes its running pod re-check at its next container start",
			func(a *admin.Local) (admin.RevokeResult, error) {
				return a.RevokeServiceAccount(ctx, "a", "builder")
			}},
		{"revoking the image makes its running pod re-check at its next container start",
			func(a *admin.Local) (admin.RevokeResult, error) { return a.RevokeImage(ctx, refApp) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, decision.NeverVerifyPreloadedImages)
			store, err := records.Open(filepath.Join(t.TempDir(), "ensure.db"), records.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { store.Close() })
			s.store = store
			s.restart(t, decision.NeverVerifyPreloadedImages)

			// A token plugin pulls for pod a1 with its service account
			// a/builder, and credential injection says so.
			s.credentials = pluginPull("alice:a-pw", pullcred.Used{Provider: "tp",
				ServiceAccount: &pullcred.ServiceAccount{Namespace: "a", Name: "builder", UID: "sa-1"}})
			s.restart(t, decision.NeverVerifyPreloadedImages)
			spec := &runtimeapi.ImageSpec{Image: private}
			_, err = s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: spec, SandboxConfig: podA.sandbox()}, s.runtimePull)
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
			admin := &admin.Local{Store: store, Core: s.guard, Daemon: s.guard}
			if res, err := tc.revoke(admin); err != nil || res.Records != 1 {
				t.Fatalf("revoke: %+v, %v", res, err)
			}
			if err := create(); status.Code(toStatus(err)) != codes.PermissionDenied {
				t.Errorf("after the revoke, the running pod's grant still lets a container in: %v", err)
			}
		})
	}
}

func TestRemoveImageAndAConcurrentPullNeverLeaveTheImageWithoutItsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSetup(t, decision.NeverVerifyPreloadedImages)
	if got := s.start(podA, private, "IfNotPresent"); got != running {
		t.Fatalf("A: %s", got)
	}
	// Right when RemoveImage has seen the image gone, pod A pulls it again
	// and the pull finishes; RemoveImage then goes on to forget the record.
	pulled := make(chan error, 1)
	var once sync.Once
	s.node.afterStatus = func(resp *runtimeapi.ImageStatusResponse) {
		if resp.GetImage() != nil {
			return
		}
		once.Do(func() {
			recorded := make(chan struct{})
			go func() {
				_, err := s.guard.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: private}, Auth: cred("alice:a-pw"), SandboxConfig: podA.sandbox()},
					func(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
						return s.node.PullImage(ctx, req)
					})
				close(recorded)
				pulled <- err
			}()
			// Without ordering, the pull records before the forget; with
			// it, the pull waits for RemoveImage. Either way, go on after
			// a bounded wait: the outcome is checked below, not the time.
			select {
			case <-recorded:
			case <-time.After(200 * time.Millisecond):
			}
		})
	}
	if _, err := s.guard.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: private}}, s.node.RemoveImage); err != nil {
		t.Fatal(err)
	}
	if err := <-pulled; err != nil {
		t.Fatal(err)
	}
	present, _ := s.node.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: refApp}})
	_, err := s.store.Get(refApp)
	if present.GetImage() != nil && errors.Is(err, ensure.ErrNotFound) {
		t.Fatalf("the image is present and its record is gone: it is now preloaded, shown to every pod")
	}
	if got := s.start(podB, private, "IfNotPresent"); got == running {
		t.Errorf("B, with no credentials, runs the image: %s", got)
	}
}
