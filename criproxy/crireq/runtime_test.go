package crireq_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// bareRuntime answers for one image by its bare hex ID only, as CRI-O
// does: "sha256:<hex>" names nothing there.
type bareRuntime struct{ id string }

func (b bareRuntime) ImageStatus(_ context.Context, in *runtimeapi.ImageStatusRequest, _ ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error) {
	if in.GetImage().GetImage() != b.id {
		return nil, status.Error(codes.NotFound, "no such image")
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{Id: b.id}}, nil
}

// TestAPullsImageRefTeachesTheRuntimesIDForm: the first ID a runtime gives
// may be a pull's image_ref; the next question by ID is then asked in the
// runtime's form, which a canonical ID alone would miss.
func TestAPullsImageRefTeachesTheRuntimesIDForm(t *testing.T) {
	const hex = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	images := crireq.RuntimeImagesIn(bareRuntime{hex}, &crireq.IDForm{})
	if _, ok, _ := images.Image(ctx, crireq.ImageQuery{Name: "sha256:" + hex}); ok {
		t.Fatalf("the fake runtime answers a canonical ID: the test proves nothing")
	}
	id := crireq.ImageID(ctx, images, "registry.test/app:v1", hex)
	if id != "sha256:"+hex {
		t.Errorf("ImageID = %q, want the canonical form", id)
	}
	img, ok, err := images.Image(ctx, crireq.ImageQuery{Name: id})
	if err != nil || !ok || img.ID != "sha256:"+hex {
		t.Errorf("the canonical ID after the pull's answer: %+v, %v, %v; want the image", img, ok, err)
	}
}
