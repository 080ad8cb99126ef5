package crireq_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// bareRuntime answers for one image by its bare hex ID only, as CRI-O
// does: "sha256:<hex>" names nothing there. It counts the questions.
type bareRuntime struct {
	id    string
	asked *int
}

func (b bareRuntime) ImageStatus(_ context.Context, in *runtimeapi.ImageStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error) {
	*b.asked++
	if in.GetImage().GetImage() != b.id {
		return nil, status.Error(codes.Unknown, "short-name did not resolve")
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: b.id}}, nil
}

const hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestACanonicalIDFindsABareIDRuntimesImage: the guard keeps IDs in the
// canonical form; a runtime that writes bare hex (CRI-O) is asked in its
// form once it answered an ID (a pull's image_ref teaches it too), and
// in both forms before (a one-shot command's first question).
func TestACanonicalIDFindsABareIDRuntimesImage(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		taught    bool
		wantAsked int
	}{
		{"before the runtime answered an ID, both forms are asked", false, 2},
		{"after a pull's image_ref, the runtime's form alone is asked", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := 0
			images := crireq.RuntimeImagesIn(bareRuntime{hex, &asked}, &crireq.IDForm{})
			if tc.taught {
				crireq.LearnPullRef(images, hex)
				if id := crireq.ImageID(ctx, images, "registry.test/app:v1", hex); id != "sha256:"+hex {
					t.Errorf("ImageID = %q, want the canonical form", id)
				}
			}
			img, ok, err := images.Image(ctx, crireq.ImageQuery{Name: "sha256:" + hex})
			if err != nil || !ok || img.ID != "sha256:"+hex {
				t.Errorf("the canonical ID: %+v, %v, %v; want the image", img, ok, err)
			}
			if asked != tc.wantAsked {
				t.Errorf("the runtime was asked %d times, want %d", asked, tc.wantAsked)
			}
		})
	}
}

func TestPulledAsAnsweredIsTheRegistrysImageOrAborted(t *testing.T) {
	t.Parallel()
	id := strings.Repeat("ab", 32)
	answered := digest.Digest("sha256:" + id)
	for _, tc := range []struct {
		name, pulled string
		ok           bool
	}{
		{"the answered image, by its full ID", "sha256:" + id, true},
		{"the answered image, by a bare ID (CRI-O's form)", id, true},
		{"another image", "sha256:" + strings.Repeat("cd", 32), false},
		{"a name, not an ID", "registry.test/a/b:v1", false},
		{"nothing", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := crireq.PulledAsAnswered("registry.test/a/b:v1", tc.pulled, answered)
			if tc.ok != (err == nil) || (err != nil && !errdefs.IsAborted(err)) {
				t.Fatalf("got %v", err)
			}
		})
	}
}
