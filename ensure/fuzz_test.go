package ensure_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// FuzzImageNamesAtCreateContainer: whatever name or ID a tenant gives
// CreateContainer for its container's image or an image volume, when the
// runtime resolves it to another tenant's private image, the container is
// refused; and no name makes the guard fail in any other way than with a
// status.
func FuzzImageNamesAtCreateContainer(f *testing.F) {
	for _, s := range []string{private, refApp, refApp[:19], refApp[7:19], strings.TrimPrefix(refApp, "sha256:"),
		"registry.test/team-a/app", "REGISTRY.test/team-a/app:v1", "registry.test/team-a/app:v1@" + refApp,
		"/var/lib/x.tar", "../x", "sha256:", "", ":", "@", "registry.test/public/tool:v1", "1111111111111"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, name string, asMount bool) {
		s := newSetup(t, decision.NeverVerifyPreloadedImages)
		if got := s.start(podA, private, "IfNotPresent"); got != running {
			t.Fatalf("A: %s", got)
		}
		s.start(podA, public, "IfNotPresent")
		ctx := context.Background()
		cfg := &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: name}}
		if asMount {
			cfg = &runtimeapi.ContainerConfig{Image: &runtimeapi.ImageSpec{Image: refTool, UserSpecifiedImage: public},
				Mounts: []*runtimeapi.Mount{{ContainerPath: "/data", Image: &runtimeapi.ImageSpec{Image: name}}}}
		}
		_, err := s.guard.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{Config: cfg, SandboxConfig: podB.sandbox()}, s.node.CreateContainer)
		if err != nil {
			if _, ok := status.FromError(toStatus(err)); !ok {
				t.Fatalf("not a status: %v", err)
			}
		}
		st, serr := s.node.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: name}})
		if serr == nil && st.GetImage().GetId() == refApp && err == nil {
			t.Fatalf("B's container with %q (the runtime resolves it to A's private image) was let in", name)
		}
		if err != nil && status.Code(toStatus(err)) == codes.PermissionDenied && strings.Contains(err.Error(), refApp[7:]) && !strings.Contains(name, refApp[7:]) {
			t.Fatalf("the refusal tells the tenant the image ID: %v", err)
		}
	})
}

// FuzzHashAuth: whatever auth a request carries, its hash is stable, never
// holds the secret, and two credentials that differ in username or
// password never share one.
func FuzzHashAuth(f *testing.F) {
	store, err := records.Open(filepath.Join(f.TempDir(), "ensure.db"), records.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close() })
	f.Add("alice", "a-s3cret-pw", "", "")
	f.Add("", "", "", "")
	f.Add("a\x00", "\xff", "YWxpY2U6cHc=", "tok")
	f.Fuzz(func(t *testing.T, user, pass, auth, token string) {
		a := ensure.Auth{Username: user, Password: pass, Auth: auth, IdentityToken: token}
		h := store.HashAuth(a)
		if h != store.HashAuth(a) {
			t.Fatal("the hash is not stable")
		}
		for _, secret := range []string{pass, auth, token} {
			if len(secret) >= 6 && strings.Contains(h, secret) {
				t.Fatalf("the hash %q holds the secret %q", h, secret)
			}
		}
		other := ensure.Auth{Username: user, Password: pass + "x", Auth: auth, IdentityToken: token}
		if h != "" && h == store.HashAuth(other) {
			t.Fatal("two passwords share a hash")
		}
	})
}
