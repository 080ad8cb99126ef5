package crireq_test

import (
	"context"
	"testing"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// TestTheProxysOwnCanonicalIDTeachesARuntimeNoForm: the guard passes its
// own canonical IDs to ImageID (pulledImage with the pull's "before",
// checkVerified and settle with a present image answered from the node).
// Those are not the runtime's answer: on a bare-hex runtime (CRI-O) they
// must not teach the canonical form, else every later question by ID (the
// kubelet's bare ID at CreateContainer, an image volume's, a removal's
// check) is asked as "sha256:<hex>", which CRI-O takes for a short name
// and answers "absent". A tenant triggers it with any re-checked pull of a
// present image (its own registry then holds the window open).
func TestTheProxysOwnCanonicalIDTeachesARuntimeNoForm(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		query string
	}{
		{"the canonical ID still finds the image after the proxy passed its own ID", "sha256:" + hex},
		{"the kubelet's bare ID still finds the image after the proxy passed its own ID", hex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked := 0
			images := crireq.RuntimeImagesIn(bareRuntime{hex, &asked}, &crireq.IDForm{})
			// The runtime's own answer teaches bare hex (a pull's image_ref).
			crireq.LearnPullRef(images, hex)
			// A re-check of the present image: the guard's canonical ID.
			if id := crireq.ImageID(ctx, images, "registry.test/app:v1", "sha256:"+hex); id != "sha256:"+hex {
				t.Fatalf("ImageID = %q", id)
			}
			img, ok, err := images.Image(ctx, crireq.ImageQuery{Name: tc.query})
			if err != nil || !ok || img.ID != "sha256:"+hex {
				t.Errorf("%s after the proxy's own ID: %+v, %v, %v; want the image (the runtime was asked in the canonical form, a short name to CRI-O)", tc.query, img, ok, err)
			}
		})
	}
}
