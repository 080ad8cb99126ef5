package ensure

import (
	"context"

	digest "github.com/opencontainers/go-digest"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
)

// Runtime is what the enforcer asks the container runtime, in its own
// terms: no CRI type crosses it. CRIRuntime adapts the CRI clients. Image
// IDs cross it in their canonical form, "sha256:<hex>", whichever form the
// runtime writes them in (CRI-O's bare hex included).
type Runtime interface {
	// Image returns the image q names (by name, image ID or ID prefix), as
	// the runtime resolves it; ok is false when it has no such image. An
	// error is the runtime's, unchanged (its gRPC code tells an answer
	// about the name from no answer at all).
	Image(ctx context.Context, q crireq.ImageQuery) (img crireq.Image, ok bool, err error)
	// Images lists the node's images.
	Images(ctx context.Context) ([]crireq.Image, error)
	// ImageLayers returns the diff_ids of the layers of the image imageID,
	// as the runtime's copy of its config lists them; ok is false when the
	// runtime does not say (no such image, or a runtime that gives no
	// config): the caller then decides as for layers it cannot see.
	ImageLayers(ctx context.Context, imageID string) (diffIDs []digest.Digest, ok bool, err error)
	// PodUID returns the UID of the pod a sandbox belongs to.
	PodUID(ctx context.Context, sandboxID string) (string, error)
	// PodUIDs returns the UIDs of the pods the runtime has sandboxes of.
	PodUIDs(ctx context.Context) (map[string]bool, error)
	// RuntimeID is an image ID (the guard keeps them in the canonical form,
	// imageref.CanonicalID) as the runtime writes it: what the guard answers
	// in the runtime's place.
	RuntimeID(id string) string
}

// Image is an image of the node, as the Runtime answers it.
type Image = crireq.Image
